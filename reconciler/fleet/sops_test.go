package fleet_test

import (
	"strings"
	"testing"
)

// Lines of the template's enrollment.sops.yaml:
//
//	 3 token: ENC[...] (value at column 8)
//	 4 sops:
//	 5 age:             (through line 10)
//	12 mac: ENC[...]

// plaintextToken stands for an enrollment token that was committed unencrypted.
const plaintextToken = "flt-enroll-7c1e0b9d4a2f-PLAINTEXT"

// enrollmentLines returns lines from..to (1-based, inclusive) of the template's
// enrollment file.
func enrollmentLines(t testing.TB, from, to int) string {
	t.Helper()
	lines := strings.SplitAfter(template(t, enrollmentFile), "\n")
	return strings.Join(lines[from-1:to], "")
}

func TestLoadRejectsEnrollmentThatIsNotSOPS(t *testing.T) {
	encrypted := strings.TrimPrefix(strings.TrimSuffix(enrollmentLines(t, 3, 3), "\n"), "token: ")
	withToken := func(v string) string { return edited(t, enrollmentFile, "token: "+encrypted, "token: "+v) }
	cases := []rejectCase{
		{
			name:    "missing",
			changes: map[string]string{enrollmentFile: removed},
			file:    exampleDir,
			msg:     "cluster directory has no enrollment.sops.yaml; create it with `flotilla cluster add`",
		},
		{
			name:    "no sops metadata",
			changes: map[string]string{enrollmentFile: enrollmentLines(t, 1, 3)},
			file:    enrollmentFile, line: 3, col: 1,
			msg: "not a SOPS file: no sops metadata; encrypt the enrollment token with sops",
		},
		{
			name:    "plaintext file without metadata",
			changes: map[string]string{enrollmentFile: "token: " + plaintextToken + "\n"},
			file:    enrollmentFile, line: 1, col: 1,
			msg:    "not a SOPS file: no sops metadata",
			secret: plaintextToken,
		},
		{
			name:    "sops metadata is no mapping",
			changes: map[string]string{enrollmentFile: enrollmentLines(t, 1, 3) + "sops: true\n"},
			file:    enrollmentFile, line: 3, col: 1,
			msg: "not a SOPS file: no sops metadata",
		},
		{
			name:    "plaintext value",
			changes: map[string]string{enrollmentFile: withToken(plaintextToken)},
			file:    enrollmentFile, line: 3, col: 8,
			msg:    "value of token is not encrypted; an enrollment file must hold only SOPS-encrypted values",
			secret: plaintextToken,
			others: true,
		},
		{
			name:    "plaintext value next to an encrypted one",
			changes: map[string]string{enrollmentFile: enrollmentLines(t, 1, 3) + "extra:\n  nested:\n    - " + plaintextToken + "\n" + enrollmentLines(t, 4, 14)},
			file:    enrollmentFile, line: 6, col: 7,
			msg:    "value of extra.nested is not encrypted",
			secret: plaintextToken,
		},
		{
			name:    "quoted plaintext value",
			changes: map[string]string{enrollmentFile: withToken(`"` + plaintextToken + `"`)},
			file:    enrollmentFile, line: 3, col: 8,
			msg:    "value of token is not encrypted",
			secret: plaintextToken,
			others: true,
		},
		{
			name:    "value that only looks encrypted",
			changes: map[string]string{enrollmentFile: withToken("ENC[AES256_GCM,data:" + plaintextToken + "]")},
			file:    enrollmentFile, line: 3, col: 8,
			msg:    "value of token is not encrypted",
			secret: plaintextToken,
			others: true,
		},
		{
			name:    "no encrypted value",
			changes: map[string]string{enrollmentFile: enrollmentLines(t, 4, 14)},
			file:    enrollmentFile, line: 1, col: 1,
			msg: "the enrollment file holds no encrypted value",
		},
		{
			name:    "no mac",
			changes: map[string]string{enrollmentFile: enrollmentLines(t, 1, 11) + enrollmentLines(t, 13, 14)},
			file:    enrollmentFile, line: 4, col: 1,
			msg: "SOPS metadata has no mac; the file was not written by sops",
		},
		{
			name:    "empty mac",
			changes: map[string]string{enrollmentFile: enrollmentLines(t, 1, 11) + "    mac: \"\"\n" + enrollmentLines(t, 13, 14)},
			file:    enrollmentFile, line: 4, col: 1,
			msg: "SOPS metadata has no mac",
		},
		{
			name:    "no recipient",
			changes: map[string]string{enrollmentFile: enrollmentLines(t, 1, 4) + enrollmentLines(t, 11, 14)},
			file:    enrollmentFile, line: 4, col: 1,
			msg: "SOPS metadata names no recipient (age, KMS or PGP); the hub could never decrypt it",
		},
		{
			name:    "empty recipient list",
			changes: map[string]string{enrollmentFile: enrollmentLines(t, 1, 4) + "    age: []\n    pgp: []\n" + enrollmentLines(t, 11, 14)},
			file:    enrollmentFile, line: 4, col: 1,
			msg: "SOPS metadata names no recipient",
		},
		{
			name:    "unterminated quote around a plaintext value",
			changes: map[string]string{enrollmentFile: "token: \"" + plaintextToken + "\n"},
			file:    enrollmentFile, line: 2,
			msg:    "invalid YAML: found unexpected end of stream",
			secret: plaintextToken,
		},
		{
			name:    "token pasted as an alias",
			changes: map[string]string{enrollmentFile: withToken("*" + plaintextToken)},
			file:    enrollmentFile, line: 3, col: 8,
			msg:    "YAML anchors and aliases are not allowed in fleet files",
			secret: plaintextToken,
		},
		{
			name:    "token pasted as an anchor",
			changes: map[string]string{enrollmentFile: withToken("&" + plaintextToken + " " + encrypted)},
			file:    enrollmentFile, line: 3, col: 8,
			msg:    "YAML anchors and aliases are not allowed in fleet files",
			secret: plaintextToken,
		},
		{
			name:    "token pasted as a tag",
			changes: map[string]string{enrollmentFile: withToken("!" + plaintextToken + " not-encrypted")},
			file:    enrollmentFile, line: 3, col: 8,
			msg:    "value of token is not encrypted",
			secret: plaintextToken,
			others: true,
		},
		{
			name:    "empty",
			changes: map[string]string{enrollmentFile: ""},
			file:    enrollmentFile,
			msg:     "file is empty",
		},
		{
			name:    "a list",
			changes: map[string]string{enrollmentFile: "- " + plaintextToken + "\n"},
			file:    enrollmentFile, line: 1, col: 1,
			msg:    "expected a YAML mapping at the top of the file",
			secret: plaintextToken,
		},
		{
			name:    "second document",
			changes: map[string]string{enrollmentFile: template(t, enrollmentFile) + "---\ntoken: " + plaintextToken + "\n"},
			file:    enrollmentFile, line: 15, col: 1,
			msg:    "file must hold a single YAML document",
			secret: plaintextToken,
		},
	}
	runRejects(t, cases)
}

func TestLoadAcceptsEnrollmentEncryptedForAnyRecipient(t *testing.T) {
	kms := enrollmentLines(t, 1, 4) + "    kms:\n        - arn: arn:aws:kms:eu-west-1:000000000000:key/example\n" + enrollmentLines(t, 11, 14)
	gcp := enrollmentLines(t, 1, 4) + "    gcp_kms:\n        - resource_id: projects/p/locations/global/keyRings/r/cryptoKeys/k\n" + enrollmentLines(t, 11, 14)
	for name, data := range map[string]string{"age": template(t, enrollmentFile), "kms": kms, "gcp_kms": gcp} {
		t.Run(name, func(t *testing.T) {
			wantNoErrors(t, loadWith(t, map[string]string{enrollmentFile: data}))
		})
	}
}
