package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent"
	"github.com/flotilla-gitops/flotilla/agent/apply"
	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// How reset recognizes the agent's Deployment, its Helm release and its credential
// Secret: the labels the chart and the agent put on them, and Helm's own annotations.
const (
	agentNameLabel      = "app.kubernetes.io/name"
	agentNameValue      = "flotilla-agent"
	instanceLabel       = "app.kubernetes.io/instance"
	helmReleaseName     = "meta.helm.sh/release-name"
	helmReleaseNS       = "meta.helm.sh/release-namespace"
	suggestedRelease    = "flotilla-agent" // the release name `flotilla cluster add` prints
	resetUserAgentName  = "flotilla-agent-reset/"
	resetDecommissionID = "reset"
)

// resetFlags are reset's command line. It reads the agent's values file, but only the
// settings that say what to remove and where: the hub's address and the enrollment
// token play no part in a reset, so neither has to be valid, or present, for it.
type resetFlags struct {
	values           string
	identity         string
	namespace        string
	credentialSecret string
	kubeconfig       string
	componentsBinary string
	dryRun           bool
	components       bool
}

func newResetCommand(getenv func(string) string) *cobra.Command {
	var rf resetFlags
	cmd := &cobra.Command{
		Use:   "reset --values FILE [--dry-run] [--components]",
		Short: "Remove what flotilla installed on this worker cluster",
		Long: "reset removes what flotilla put on this worker cluster: the objects the agent applied\n" +
			"for its identity (labelled " + v1alpha1.WorkerClusterLabel + "=<identity>), the agent's credential\n" +
			"Secret and, with --components, the Helm releases of Kueue and JobSet that flotilla\n" +
			"installed. It prints the plan first; --dry-run prints only the plan.\n\n" +
			"It never deletes a namespace, a CRD, a customer's Job, JobSet or Workload, or a Kueue\n" +
			"object that is not labelled for this identity. The agent's own Helm release, and the\n" +
			"RBAC its chart created, stay the administrator's to uninstall; reset prints the command.\n" +
			"Stop the agent first (scale its Deployment to zero): a running agent would write its\n" +
			"credential and apply its state again, so reset refuses to run beside it.\n\n" +
			"Run it as the cluster's administrator, with the agent's values file for its settings\n" +
			"(cluster.identity, agent.namespace, agent.credentialSecret), each overridable by a flag.\n" +
			"Enrolling the cluster again afterwards needs a new enrollment token.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadResetConfig(rf, cmd.Flags().Changed, getenv)
			if err != nil {
				return err
			}
			opts := resetOptions{dryRun: rf.dryRun, components: rf.components}
			return runReset(cmd.Context(), cfg, opts, cmd.OutOrStdout(), cmd.ErrOrStderr(), getenv)
		},
	}
	f := cmd.Flags()
	f.SortFlags = false
	f.BoolVar(&rf.dryRun, "dry-run", false, "print what would be removed, and remove nothing")
	f.BoolVar(&rf.components, "components", false, "also uninstall the Helm releases of Kueue and JobSet that flotilla installed (their CRDs are kept)")
	f.StringVar(&rf.values, "values", "", "the agent chart's values file holding its settings")
	f.StringVar(&rf.identity, "identity", "", "the worker cluster's identity (cluster.identity)")
	f.StringVar(&rf.namespace, "namespace", "", "the agent's namespace, where its credential Secret is kept (agent.namespace; default $"+namespaceEnv+", else "+defaultNamespace+")")
	f.StringVar(&rf.credentialSecret, "credential-secret", defaultCredentialSecret, "the Secret the agent keeps its credential in (agent.credentialSecret)")
	f.StringVar(&rf.kubeconfig, "kubeconfig", "", "a kubeconfig for the worker cluster (default: in-cluster, else $"+kubeconfigEnv+")")
	f.StringVar(&rf.componentsBinary, "components-binary", "", "the installer of Kueue and JobSet, for --components (default: "+components.BinaryName+" beside this executable)")
	return cmd
}

// loadResetConfig reads the settings reset needs, as loadConfig does for the agent: a
// flag that was given wins over the values file, which wins over the default. Every
// problem is reported; the values file's token is never read into a message.
func loadResetConfig(rf resetFlags, changed func(string) bool, getenv func(string) string) (*config, error) {
	st, err := readSettings(rf.values, changed)
	if err != nil {
		return nil, err
	}
	cfg := &config{Kubeconfig: rf.kubeconfig, ComponentsBinary: rf.componentsBinary}
	cfg.Identity = st.identity(rf.identity, "cluster.identity is required: the identity whose objects are removed (set it with --values or --identity)")
	// The cluster's name only completes the command printed for a new token.
	if v, ok := st.vals["cluster.name"]; ok && len(validation.IsDNS1123Label(v.value)) == 0 {
		cfg.Cluster = v.value
	}
	cfg.Namespace = st.namespace(rf.namespace, getenv)
	cfg.CredentialSecret = st.credentialSecret(rf.credentialSecret)
	if err := st.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

type resetOptions struct {
	dryRun     bool
	components bool
}

// resetPlan is what reset found to remove, and what it leaves and why.
type resetPlan struct {
	// objects are what a decommission finds owned, in its delete order: those it prunes
	// and those it keeps (prune disabled).
	objects []protocol.ObjectResult
	// secret is the agent's credential Secret, nil when there is none. Only its metadata
	// is ever read: reset never holds the credential.
	secret *metav1.PartialObjectMetadata
	// foreignSecret: a Secret of the credential's name exists but the agent did not write it.
	foreignSecret bool
	// releases are the installer's dry-run lines, with --components.
	releases []string
	// agents are the agent Deployments of the namespace.
	agents []appsv1.Deployment
	// namespaces are those created for this identity; they are kept.
	namespaces []string
}

// runReset prints the plan and, unless it is a dry run, carries it out.
func runReset(ctx context.Context, cfg *config, opts resetOptions, out, stderr io.Writer, getenv func(string) string) error {
	log := newLogger(stderr, slog.LevelWarn)
	restCfg, err := restConfig(cfg.Kubeconfig, getenv)
	if err != nil {
		return err
	}
	restCfg.UserAgent = resetUserAgentName + agentVersion()
	restCfg.QPS, restCfg.Burst = 20, 50
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("building the scheme: %w", err)
	}
	c, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("connecting to the worker's API server %s: %w", restCfg.Host, err)
	}
	// The installer is looked for first: a missing one ends the reset before anything
	// is read, let alone removed.
	var inst *components.Installer
	if opts.components {
		if inst, err = resetInstaller(cfg, restCfg, stderr); err != nil {
			return err
		}
	}
	applier, err := apply.New(apply.Options{Client: c, Identity: cfg.Identity, FieldManager: agent.FieldManager, Log: log})
	if err != nil {
		return err
	}

	p, err := readPlan(ctx, c, applier, inst, cfg)
	if err != nil {
		return fmt.Errorf("%w; nothing was removed", err)
	}
	p.print(out, cfg, opts)
	if opts.dryRun {
		fmt.Fprintln(out, "\nDry run: nothing was changed.")
		return nil
	}
	if running := p.runningAgents(); len(running) > 0 {
		return fmt.Errorf("the agent still runs (Deployment %s); nothing was removed: stop it first, e.g. `kubectl scale deployment/%s --namespace %s --replicas=0`",
			deploymentNames(running), running[0].Name, running[0].Namespace)
	}
	if err := checkDeletable(ctx, c, p, cfg); err != nil {
		return err
	}
	return p.carryOut(ctx, c, applier, inst, cfg, out)
}

// resetInstaller is the installer of Kueue and JobSet, acting as whoever runs the reset.
func resetInstaller(cfg *config, restCfg *rest.Config, stderr io.Writer) (*components.Installer, error) {
	bin := cfg.ComponentsBinary
	if bin == "" {
		var err error
		if bin, err = components.BesideExecutable(); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("--components: the installer of Kueue and JobSet is missing (%w); nothing was removed. Pass --components-binary, or reset without --components to keep the releases", err)
	}
	kc, err := components.KubeConfigFor(restCfg)
	if err != nil {
		return nil, fmt.Errorf("--components: %w; nothing was removed", err)
	}
	return &components.Installer{Binary: bin, KubeConfig: kc, Stderr: stderr}, nil
}

// readPlan reads the cluster and changes nothing.
func readPlan(ctx context.Context, c client.Client, applier *apply.Applier, inst *components.Installer, cfg *config) (*resetPlan, error) {
	p := &resetPlan{}
	var err error
	if p.objects, err = applier.Owned(ctx); err != nil {
		return nil, err
	}

	sec := &metav1.PartialObjectMetadata{}
	sec.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	switch err := c.Get(ctx, client.ObjectKey{Namespace: cfg.Namespace, Name: cfg.CredentialSecret}, sec); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, fmt.Errorf("reading the credential Secret %s/%s: %w", cfg.Namespace, cfg.CredentialSecret, err)
	case writtenByAgent(sec):
		p.secret = sec
	default:
		p.foreignSecret = true
	}

	if inst != nil {
		rep, err := inst.Uninstall(ctx, true)
		if err != nil {
			return nil, fmt.Errorf("listing the Helm releases flotilla installed: %w", err)
		}
		p.releases = rep.Removed
	}

	var deps appsv1.DeploymentList
	if err := c.List(ctx, &deps, client.InNamespace(cfg.Namespace), client.MatchingLabels{agentNameLabel: agentNameValue}); err != nil {
		return nil, fmt.Errorf("looking for the agent's Deployment in namespace %s: %w", cfg.Namespace, err)
	}
	p.agents = deps.Items

	var nss metav1.PartialObjectMetadataList
	nss.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NamespaceList"))
	if err := c.List(ctx, &nss, client.MatchingLabels{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue, v1alpha1.WorkerClusterLabel: cfg.Identity}); err != nil {
		return nil, fmt.Errorf("listing the namespaces created for %s: %w", cfg.Identity, err)
	}
	for _, ns := range nss.Items {
		p.namespaces = append(p.namespaces, ns.Name)
	}
	slices.Sort(p.namespaces)
	return p, nil
}

// writtenByAgent tells the agent's credential Secret from another of the same name: the
// agent writes it by server-side apply, as its field manager, with the chart's name label.
func writtenByAgent(sec *metav1.PartialObjectMetadata) bool {
	if sec.Labels[agentNameLabel] == agentNameValue {
		return true
	}
	return slices.ContainsFunc(sec.ManagedFields, func(m metav1.ManagedFieldsEntry) bool { return m.Manager == agent.FieldManager })
}

// runningAgents names the agent Deployments that want or still have a replica. Not
// only ready ones count: a crash-looping agent still applies between its crashes.
func (p *resetPlan) runningAgents() []appsv1.Deployment {
	var out []appsv1.Deployment
	for _, d := range p.agents {
		if ptrOr(d.Spec.Replicas, 1) > 0 || d.Status.Replicas > 0 {
			out = append(out, d)
		}
	}
	return out
}

func deploymentNames(ds []appsv1.Deployment) string {
	names := make([]string, len(ds))
	for i, d := range ds {
		names[i] = d.Namespace + "/" + d.Name
	}
	return strings.Join(names, ", ")
}

func ptrOr(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

// agentRelease is the agent's Helm release and its namespace, as Helm annotated its
// Deployment; found is false when no Deployment of the chart is there.
func (p *resetPlan) agentRelease(namespace string) (name, ns string, found bool) {
	for _, d := range p.agents {
		name = cmp.Or(d.Annotations[helmReleaseName], d.Labels[instanceLabel])
		if name != "" {
			return name, cmp.Or(d.Annotations[helmReleaseNS], d.Namespace), true
		}
	}
	return suggestedRelease, namespace, false
}

func (p *resetPlan) removedObjects() []protocol.ObjectResult {
	var out []protocol.ObjectResult
	for _, r := range p.objects {
		if r.Action == protocol.ActionPruned {
			out = append(out, r)
		}
	}
	return out
}

// objectLine names an object as the plan and the result print it.
func objectLine(r protocol.ObjectResult) string {
	if r.Namespace == "" {
		return r.Kind + " " + r.Name
	}
	return r.Kind + " " + r.Namespace + "/" + r.Name
}

func secretLine(cfg *config) string { return "Secret " + cfg.Namespace + "/" + cfg.CredentialSecret }

// section prints a heading and its items, or the heading and "none".
func section(w io.Writer, heading string, items []string) {
	if len(items) == 0 {
		fmt.Fprintf(w, "%s: none\n", heading)
		return
	}
	fmt.Fprintf(w, "%s:\n", heading)
	for _, it := range items {
		fmt.Fprintf(w, "  - %s\n", it)
	}
}

func (p *resetPlan) print(w io.Writer, cfg *config, opts resetOptions) {
	mode := ""
	if opts.dryRun {
		mode = "; dry run, nothing will be changed"
	}
	fmt.Fprintf(w, "Reset of worker cluster %s (agent namespace %s)%s.\n\n", cfg.Identity, cfg.Namespace, mode)

	var objs []string
	for _, r := range p.removedObjects() {
		line := objectLine(r)
		if r.Message != "" {
			line += " (" + r.Message + ")"
		}
		objs = append(objs, line)
	}
	section(w, "Will remove the objects the agent applied for "+cfg.Identity+", in this order", objs)
	var secs []string
	if p.secret != nil {
		secs = append(secs, secretLine(cfg))
	}
	section(w, "Will remove the agent's credential", secs)
	if opts.components {
		section(w, "Will remove the Helm releases flotilla installed, and their objects", p.releases)
	}

	var keep []string
	for _, r := range p.objects {
		if r.Action != protocol.ActionPruned {
			keep = append(keep, objectLine(r)+": "+r.Message)
		}
	}
	if p.foreignSecret {
		keep = append(keep, secretLine(cfg)+": not written by the agent")
	}
	for _, ns := range p.namespaces {
		keep = append(keep, "Namespace "+ns+": created for "+cfg.Identity+", but namespaces hold customers' workloads")
	}
	keep = append(keep,
		"Namespaces, CRDs, and customers' Jobs, JobSets and Workloads: a reset never deletes them",
		"Kueue objects not labelled "+v1alpha1.WorkerClusterLabel+"="+cfg.Identity+": not this agent's")
	if !opts.components {
		keep = append(keep, "The Helm releases of Kueue and JobSet: removed only with --components")
	}
	rel, relNS, _ := p.agentRelease(cfg.Namespace)
	keep = append(keep, fmt.Sprintf("The agent's own Helm release %s, and the RBAC its chart created: the administrator's; after the reset run `helm uninstall %s --namespace %s`", rel, rel, relNS))
	fmt.Fprintln(w)
	section(w, "Will leave alone", keep)

	fmt.Fprintln(w)
	switch running := p.runningAgents(); {
	case len(running) > 0:
		fmt.Fprintf(w, "The agent still runs (Deployment %s): it would write its credential and apply its state again, so reset removes nothing until it is scaled to zero.\n", deploymentNames(running))
	case len(p.agents) == 0:
		fmt.Fprintf(w, "No agent Deployment (label %s=%s) is in namespace %s: make sure no agent of %s runs elsewhere, or it applies its state again.\n", agentNameLabel, agentNameValue, cfg.Namespace, cfg.Identity)
	default:
		fmt.Fprintln(w, "The agent's Deployment is scaled to zero.")
	}
}

// checkDeletable asks the API server whether the user of the kubeconfig may delete
// everything the plan removes, so that a reset without the rights stops before it
// removes anything rather than half way.
func checkDeletable(ctx context.Context, c client.Client, p *resetPlan, cfg *config) error {
	type target struct {
		line  string
		attrs authorizationv1.ResourceAttributes
	}
	var targets []target
	for _, r := range p.removedObjects() {
		gv, err := schema.ParseGroupVersion(r.APIVersion)
		if err != nil {
			return fmt.Errorf("%s: %w", objectLine(r), err)
		}
		m, err := c.RESTMapper().RESTMapping(schema.GroupKind{Group: gv.Group, Kind: r.Kind}, gv.Version)
		if err != nil {
			return fmt.Errorf("%s: %w; nothing was removed", objectLine(r), err)
		}
		targets = append(targets, target{objectLine(r), authorizationv1.ResourceAttributes{
			Verb: "delete", Group: gv.Group, Version: gv.Version, Resource: m.Resource.Resource, Namespace: r.Namespace, Name: r.Name}})
	}
	if p.secret != nil {
		targets = append(targets, target{secretLine(cfg), authorizationv1.ResourceAttributes{
			Verb: "delete", Version: "v1", Resource: "secrets", Namespace: cfg.Namespace, Name: cfg.CredentialSecret}})
	}
	var denied []string
	for _, t := range targets {
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &t.attrs}}
		if err := c.Create(ctx, review); err != nil {
			return fmt.Errorf("asking whether %s may be deleted: %w; nothing was removed", t.line, err)
		}
		if !review.Status.Allowed {
			denied = append(denied, t.line)
		}
	}
	if len(denied) > 0 {
		return fmt.Errorf("the kubeconfig's user may not delete %s; nothing was removed: run reset as the cluster's administrator", strings.Join(denied, ", "))
	}
	return nil
}

// carryOut removes what the plan lists, in its order: the applied objects while Kueue
// still runs (it releases a ClusterQueue's finalizer), the credential, then the releases.
func (p *resetPlan) carryOut(ctx context.Context, c client.Client, applier *apply.Applier, inst *components.Installer, cfg *config, w io.Writer) error {
	planned := map[string]bool{}
	for _, r := range p.removedObjects() {
		planned[objectLine(r)] = true
	}
	var removed, left, notRemoved []string
	pending := 0
	applied := applier.Apply(ctx, protocol.DesiredState{Hash: resetDecommissionID, Decommission: true})
	for _, r := range applied.Results {
		line := objectLine(r)
		switch {
		case r.Action == protocol.ActionPruned && r.Message != "":
			pending++
			removed = append(removed, line+" ("+r.Message+")")
		case r.Action == protocol.ActionPruned && !planned[line]:
			removed = append(removed, line+" (appeared after the plan was read)")
		case r.Action == protocol.ActionPruned:
			removed = append(removed, line)
		case r.Action == protocol.ActionSkipped:
			// Kept by design (prune disabled, or relabelled since it was listed).
			left = append(left, line+": "+r.Message)
		default:
			notRemoved = append(notRemoved, line+": "+string(r.Action)+": "+r.Message)
		}
	}
	var errs []error
	if applied.Error != "" {
		errs = append(errs, fmt.Errorf("removing the applied objects: %s", applied.Error))
	}
	if len(notRemoved) > 0 {
		errs = append(errs, fmt.Errorf("%d objects were not removed", len(notRemoved)))
	}

	if p.secret != nil {
		err := c.Delete(ctx, p.secret, client.Preconditions{UID: &p.secret.UID, ResourceVersion: &p.secret.ResourceVersion})
		switch {
		case err == nil, apierrors.IsNotFound(err):
			removed = append(removed, secretLine(cfg))
		default:
			// A conflict means the Secret changed since it was read: an agent wrote it.
			notRemoved = append(notRemoved, secretLine(cfg)+": "+err.Error())
			errs = append(errs, fmt.Errorf("removing %s: %w", secretLine(cfg), err))
		}
	}

	if inst != nil {
		if len(errs) > 0 || pending > 0 {
			// Uninstalling Kueue now would leave a ClusterQueue terminating for ever:
			// its finalizer is Kueue's to remove.
			notRemoved = append(notRemoved, "The Helm releases of Kueue and JobSet: kept until every object above is gone; run reset --components again")
			errs = append(errs, errors.New("the Helm releases were not removed"))
		} else if rep, err := inst.Uninstall(ctx, false); err != nil {
			notRemoved = append(notRemoved, "The Helm releases of Kueue and JobSet: "+err.Error())
			errs = append(errs, fmt.Errorf("removing the Helm releases: %w", err))
		} else {
			removed = append(removed, rep.Removed...)
		}
	}

	fmt.Fprintln(w)
	section(w, "Removed", removed)
	if len(left) > 0 {
		section(w, "Left alone", left)
	}
	if len(notRemoved) > 0 {
		section(w, "Not removed", notRemoved)
	}
	rel, relNS, _ := p.agentRelease(cfg.Namespace)
	name := cmp.Or(cfg.Cluster, "NAME")
	fmt.Fprintf(w, "\nEnrolling this cluster again needs a NEW enrollment token: the old one was redeemed, and the hub refuses it.\n"+
		"In the fleet repository, `flotilla cluster rotate-token %s` writes one, with a new values file to install the agent with.\n"+
		"Uninstall the old agent's release rather than scaling it up again: `helm uninstall %s --namespace %s`.\n", name, rel, relNS)
	if pending > 0 {
		fmt.Fprintf(w, "%d objects are still being deleted: their finalizers are Kueue's to remove.\n", pending)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("the reset is incomplete: %w; run it again once the cause is fixed", err)
	}
	return nil
}
