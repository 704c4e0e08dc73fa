// Package install runs the README's "Run it on your clusters" path on real control planes,
// command by command, as a platform team would: from a hub cluster and a Git forge to a first
// worker cluster whose commit turns green.
//
// The test reads the section's ```sh blocks from README.md, so that the README cannot drift
// from what is tested, and runs each command in one bash session: flotilla built from this
// repository, git against a real git server (test/gitserver), helm and kubectl built from the
// Go module proxy (test/testbin/helm.sh, kubectl.sh) and age-keygen (age-keygen.sh). The hub
// cluster and the worker are control planes of test/controlplane, started once in TestMain.
//
// What a user's machine or cluster would supply and these machines cannot is stood in for,
// each in one place:
//   - the README's placeholders (the hub's DNS name, the forge's repository, the Kueue
//     chart's OCI reference, for which there is no network) are replaced through one
//     substitution table in readme_test.go, which says why for each; a placeholder the
//     README no longer has fails the test;
//   - no kubelet runs here: test/podrunner runs the hub and agent binaries built from this
//     repository behind the charts' Deployments, with the configuration the charts render
//     and the charts' ServiceAccounts, and plays their Services on loopback;
//     test/componenttest runs the real Kueue and JobSet managers behind theirs. The hub runs
//     as its chart's ServiceAccount throughout, so a permission missing from the chart's RBAC
//     fails this test rather than a user's first install;
//   - the steps without a command (create the repository on the forge, connect its
//     webhook, open and merge the pull request) are done by the test as the forge would do
//     them: a bare repository, a refs/pull/N/head, a merge commit, and the signed webhook
//     deliveries the forge sends;
//   - the user's own files (the hub's certificate from their CA, the forge token, their git
//     credentials) are written by the test before the commands run.
//
// The path ends where the README says it does: the merge commit's status for the cluster is
// success and its WorkerCluster is DispatchReady. Then the leading hub replica is deleted and
// the agent reconnects to the other through the same tunnel Service, and no process's output,
// nor the session's, holds a token or a secret.
package install
