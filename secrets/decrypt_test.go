package secrets

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/getsops/sops/v3/keyservice"
	"github.com/getsops/sops/v3/logging"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"

	"github.com/flotilla-gitops/flotilla/test/logtest"
	"github.com/flotilla-gitops/flotilla/test/sopstest"
)

// repo is a directory with a .sops.yaml, like a fleet repository's checkout.
type repo struct {
	dir, config string
}

func newRepo(t testing.TB, rules ...sopstest.Rule) repo {
	dir := t.TempDir()
	return repo{dir: dir, config: sopstest.WriteConfig(t, dir, rules...)}
}

func (r repo) encrypt(t testing.TB, cluster string, tok Token) (string, []byte) {
	t.Helper()
	rel := "clusters/" + cluster + "/enrollment.sops.yaml"
	out, err := EncryptEnrollment(r.config, filepath.Join(r.dir, rel), tok)
	if err != nil {
		t.Fatalf("EncryptEnrollment: %v", err)
	}
	return rel, out
}

func decryptor(t testing.TB, ids ...*age.X25519Identity) *Decryptor {
	list := make([]age.Identity, len(ids))
	for i, id := range ids {
		list[i] = id
	}
	held, err := NewIdentities(list...)
	if err != nil {
		t.Fatal(err)
	}
	return NewDecryptor(DecryptorOptions{Identities: held})
}

// captureSOPSLogs turns SOPS's own loggers up to debug into a buffer, so that a test can
// check that not even the library's debug output carries a token.
func captureSOPSLogs(t *testing.T) *logtest.Buffer {
	buf := &logtest.Buffer{}
	for _, l := range logging.Loggers {
		out, level := l.Out, l.GetLevel()
		l.SetOutput(buf)
		l.SetLevel(logrus.DebugLevel)
		t.Cleanup(func() { l.SetOutput(out); l.SetLevel(level) })
	}
	return buf
}

func TestEncryptThenDecryptGivesTheTokensHash(t *testing.T) {
	logs := captureSOPSLogs(t)
	hub := sopstest.NewIdentity(t)
	admin := sopstest.NewIdentity(t)
	r := newRepo(t, sopstest.Rule{PathRegex: sopstest.EnrollmentPathRegex, EncryptedRegex: "^token$", Age: []*age.X25519Identity{hub, admin}})
	tok, _ := NewToken()
	file, data := r.encrypt(t, "gpu-a", tok)

	if bytes.Contains(data, []byte(tok.Reveal())) {
		t.Fatal("the encrypted file holds the token")
	}
	for _, want := range []string{"token: ENC[AES256_GCM,", "mac: ENC[AES256_GCM,", hub.Recipient().String(), admin.Recipient().String()} {
		if !bytes.Contains(data, []byte(want)) {
			t.Errorf("the encrypted file lacks %q:\n%s", want, data)
		}
	}
	for _, id := range []*age.X25519Identity{hub, admin} {
		h, err := decryptor(t, id).TokenHash(context.Background(), file, data)
		if err != nil {
			t.Fatalf("TokenHash: %v", err)
		}
		if !h.Equal(tok.Hash()) {
			t.Fatal("the decrypted hash is not the token's")
		}
	}
	if strings.Contains(logs.String(), tok.Reveal()) {
		t.Fatal("SOPS logged the token")
	}
}

func TestDecryptNeedsNoEnvironmentAndNoKeyFile(t *testing.T) {
	// A key file where SOPS would look for one, holding the wrong key, and the variables
	// SOPS reads pointing at it: the hub must ignore all of them.
	home := t.TempDir()
	wrong := sopstest.NewIdentity(t)
	keyFile := sopstest.WriteKeyFile(t, home, "keys.txt", wrong)
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", home)
	t.Setenv("SOPS_AGE_KEY_FILE", keyFile)
	t.Setenv("SOPS_AGE_KEY", wrong.String())

	hub := sopstest.NewIdentity(t)
	r := newRepo(t, sopstest.Rule{Age: []*age.X25519Identity{hub, wrong}})
	tok, _ := NewToken()
	file, data := r.encrypt(t, "gpu-a", tok)
	if _, err := decryptor(t, hub).TokenHash(context.Background(), file, data); err != nil {
		t.Fatalf("decrypting with the in-memory identity: %v", err)
	}
	stranger := sopstest.NewIdentity(t)
	if _, err := decryptor(t, stranger).TokenHash(context.Background(), file, data); !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("an identity that is no recipient decrypted the file through SOPS's environment: %v", err)
	}
}

// tamper edits the first match of re in data with edit.
func tamper(t *testing.T, data []byte, re string, edit func(string) string) []byte {
	t.Helper()
	loc := regexp.MustCompile(re).FindIndex(data)
	if loc == nil {
		t.Fatalf("%s not in the file", re)
	}
	out := append([]byte{}, data[:loc[0]]...)
	out = append(out, edit(string(data[loc[0]:loc[1]]))...)
	return append(out, data[loc[1]:]...)
}

// lastFlipped changes the last character of s, a base64 digit, to another one.
func lastFlipped(s string) string {
	b := []byte(s)
	if b[len(b)-1] == 'A' {
		b[len(b)-1] = 'B'
	} else {
		b[len(b)-1] = 'A'
	}
	return string(b)
}

func TestBadEnrollmentFilesFailWithTheirOwnErrorAndNoToken(t *testing.T) {
	logs := captureSOPSLogs(t)
	hub := sopstest.NewIdentity(t)
	other := sopstest.NewIdentity(t)
	r := newRepo(t,
		sopstest.Rule{PathRegex: "^clusters/foreign/", Age: []*age.X25519Identity{other}},
		sopstest.Rule{PathRegex: sopstest.EnrollmentPathRegex, EncryptedRegex: "^token$", Age: []*age.X25519Identity{hub}})
	tok, _ := NewToken()
	_, good := r.encrypt(t, "gpu-a", tok)
	_, foreign := r.encrypt(t, "foreign", tok)
	_, notAToken := r.encrypt(t, "gpu-b", Token{s: "hunter2"})
	plaintext := tamper(t, good, `ENC\[AES256_GCM,data:[^\]]*\]`, func(string) string { return tok.Reveal() })
	twoKeys := append(bytes.Clone(good), []byte("extra: ENC[AES256_GCM,data:AAAA,iv:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=,tag:AAAAAAAAAAAAAAAAAAAAAA==,type:str]\n")...)
	kms := kmsEnrollment()

	for _, tc := range []struct {
		name string
		data []byte
		want error
		says string
	}{
		{"tampered token ciphertext", tamper(t, good, `token: ENC\[AES256_GCM,data:[A-Za-z0-9+/]`, lastFlipped), ErrIntegrity, "changed"},
		{"tampered MAC", tamper(t, good, `mac: ENC\[AES256_GCM,data:[A-Za-z0-9+/]`, lastFlipped), ErrIntegrity, "MAC"},
		{"tampered lastmodified", tamper(t, good, `lastmodified: "[0-9]{4}`, func(s string) string { return strings.Replace(s, "20", "19", 1) }), ErrIntegrity, "lastmodified"},
		{"encrypted only to another recipient", foreign, ErrNoIdentity, other.Recipient().String()},
		{"malformed sops block", regexp.MustCompile(`(?s)sops:.*`).ReplaceAll(bytes.Clone(good), []byte("sops: [1, 2]\n")), ErrMalformed, "not a mapping"},
		{"no sops block", []byte("token: ENC[AES256_GCM,data:AAAA,iv:AAAA,tag:AAAA,type:str]\n"), ErrMalformed, "no sops metadata"},
		{"sops block without a mac", regexp.MustCompile(`(?m)^    mac: .*\n`).ReplaceAll(bytes.Clone(good), nil), ErrMalformed, "has no mac"},
		{"truncated", good[:len(good)/2], ErrMalformed, "truncated"},
		{"not YAML", []byte("token: [unclosed\n"), ErrMalformed, "not YAML"},
		{"over the size cap", append(bytes.Repeat([]byte("# padding\n"), MaxEnrollmentFileSize/10), good...), ErrTooLarge, "at most 65536"},
		{"plaintext token under a sops block", plaintext, ErrMalformed, "not encrypted"},
		{"a second key", twoKeys, ErrIntegrity, ""},
		{"decrypts to something that is not a token", notAToken, ErrToken, "not a flotilla enrollment token"},
		{"encrypted to a KMS the hub may not use", kms, ErrKeyUnavailable, "KMS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const file = "clusters/gpu-a/enrollment.sops.yaml"
			_, err := decryptor(t, hub).TokenHash(context.Background(), file, tc.data)
			if !errors.Is(err, tc.want) {
				t.Fatalf("TokenHash = %v, want %v", err, tc.want)
			}
			msg := err.Error()
			t.Log(msg)
			if !strings.HasPrefix(msg, file+": ") {
				t.Errorf("error %q does not start with the file", msg)
			}
			if !strings.Contains(msg, tc.says) {
				t.Errorf("error %q does not say %q", msg, tc.says)
			}
			if strings.Contains(msg, tok.Reveal()) || strings.Contains(msg, "hunter2") {
				t.Errorf("error %q holds the plaintext", msg)
			}
		})
	}
	if out := logs.String(); strings.Contains(out, tok.Reveal()) || strings.Contains(out, "hunter2") {
		t.Fatal("SOPS logged the plaintext")
	}
}

// kmsEnrollment is an enrollment file encrypted to an AWS KMS key alone.
func kmsEnrollment() []byte {
	return []byte("token: ENC[AES256_GCM,data:AAAA,iv:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=,tag:AAAAAAAAAAAAAAAAAAAAAA==,type:str]\n" +
		"sops:\n    kms:\n        - arn: arn:aws:kms:us-east-1:111122223333:key/00000000-0000-0000-0000-000000000000\n" +
		"          created_at: \"2026-12-01T00:00:00Z\"\n          enc: AQICAHg=\n" +
		"    lastmodified: \"2026-12-01T00:00:00Z\"\n    mac: ENC[AES256_GCM,data:AAAA,iv:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=,tag:AAAAAAAAAAAAAAAAAAAAAA==,type:str]\n    version: 3.13.3\n")
}

// silentKMS is a key service that never answers, as a cloud's KMS may not.
type silentKMS struct{ keyservice.KeyServiceClient }

func (silentKMS) Decrypt(ctx context.Context, _ *keyservice.DecryptRequest, _ ...grpc.CallOption) (*keyservice.DecryptResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A KMS that does not answer fails the decryption within the hub's bound, as a key that
// could not be had; so does a decryption the hub cut short. Neither says anything of
// the file, which is not judged invalid.
func TestASilentKMSAndACutShortDecryptionLeaveTheFileUnjudged(t *testing.T) {
	const file = "clusters/gpu-a/enrollment.sops.yaml"
	hub := sopstest.NewIdentity(t)
	r := newRepo(t, sopstest.Rule{PathRegex: sopstest.EnrollmentPathRegex, EncryptedRegex: "^token$", Age: []*age.X25519Identity{hub}})
	tok, _ := NewToken()
	_, good := r.encrypt(t, "gpu-a", tok)

	d := decryptor(t, hub)
	d.svc.kms, d.svc.local, d.svc.timeout = true, silentKMS{}, 50*time.Millisecond
	done := make(chan error, 1)
	go func() {
		_, err := d.TokenHash(context.Background(), file, kmsEnrollment())
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrKeyUnavailable) || !strings.Contains(err.Error(), "did not answer within 50ms") {
			t.Errorf("TokenHash through a silent KMS = %v, want %v saying it did not answer", err, ErrKeyUnavailable)
		}
	case <-time.After(time.Minute):
		t.Fatal("TokenHash waits on a KMS that does not answer")
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := decryptor(t, hub).TokenHash(ctx, file, good); !errors.Is(err, ErrKeyUnavailable) || errors.Is(err, ErrMalformed) {
		t.Errorf("TokenHash cut short = %v, want %v", err, ErrKeyUnavailable)
	}
}

func TestFirstMatchingCreationRuleWins(t *testing.T) {
	special := sopstest.NewIdentity(t)
	general := sopstest.NewIdentity(t)
	catchAll := sopstest.NewIdentity(t)
	r := newRepo(t,
		sopstest.Rule{PathRegex: `^clusters/special-[^/]+/`, Age: []*age.X25519Identity{special}},
		sopstest.Rule{PathRegex: `^clusters/`, Age: []*age.X25519Identity{general}},
		sopstest.Rule{Age: []*age.X25519Identity{catchAll}},
		sopstest.Rule{PathRegex: `^clusters/special-b/`, Age: []*age.X25519Identity{catchAll}})
	tok, _ := NewToken()
	for _, tc := range []struct {
		cluster string
		reader  *age.X25519Identity
	}{
		{"special-a", special},
		{"special-b", special}, // a later, more specific rule does not override an earlier one
		{"ordinary", general},
	} {
		file, data := r.encrypt(t, tc.cluster, tok)
		for _, id := range []*age.X25519Identity{special, general, catchAll} {
			_, err := decryptor(t, id).TokenHash(context.Background(), file, data)
			if (id == tc.reader) != (err == nil) {
				t.Errorf("%s: decryption with %s = %v; only the first matching rule's recipient may decrypt", tc.cluster, id.Recipient(), err)
			}
		}
	}

	// A rule that leaves the token unencrypted is refused before anything is written.
	leaky := newRepo(t, sopstest.Rule{EncryptedRegex: "^nothing$", Age: []*age.X25519Identity{general}})
	_, err := EncryptEnrollment(leaky.config, filepath.Join(leaky.dir, "clusters/a/enrollment.sops.yaml"), tok)
	if err == nil || !strings.Contains(err.Error(), "unencrypted") || strings.Contains(err.Error(), tok.Reveal()) {
		t.Fatalf("EncryptEnrollment with a rule that encrypts nothing = %v", err)
	}
	none := newRepo(t, sopstest.Rule{PathRegex: "^elsewhere/", Age: []*age.X25519Identity{general}})
	if _, err := EncryptEnrollment(none.config, filepath.Join(none.dir, "clusters/a/enrollment.sops.yaml"), tok); err == nil || !strings.Contains(err.Error(), "no matching creation rules") {
		t.Fatalf("EncryptEnrollment without a matching rule = %v", err)
	}
}

func TestConcurrentDecryptionDecryptsEachContentOnce(t *testing.T) {
	hub := sopstest.NewIdentity(t)
	r := newRepo(t, sopstest.Rule{Age: []*age.X25519Identity{hub}})
	const files = 64
	type enc struct {
		file string
		data []byte
		want Hash
	}
	var all []enc
	for i := range files {
		tok, _ := NewToken()
		file, data := r.encrypt(t, fmt.Sprintf("c%d", i), tok)
		all = append(all, enc{file, data, tok.Hash()})
	}
	d := decryptor(t, hub)
	var wg sync.WaitGroup
	errs := make(chan error, 8*files)
	for w := range 8 {
		wg.Go(func() {
			for i := range all {
				e := all[(i+w*7)%files]
				h, err := d.TokenHash(context.Background(), e.file, e.data)
				if err != nil {
					errs <- err
				} else if !h.Equal(e.want) {
					errs <- fmt.Errorf("%s: wrong hash", e.file)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := d.Decryptions(); n != files {
		t.Fatalf("%d decryptions for %d distinct files read 8 times each; want one each", n, files)
	}
	// The same content under another name is the same blob: no new decryption.
	if _, err := d.TokenHash(context.Background(), "clusters/copy/enrollment.sops.yaml", all[0].data); err != nil || d.Decryptions() != files {
		t.Fatalf("a copy of a decrypted file was decrypted again (%v)", err)
	}
}

func TestParseIdentitiesFromAKeyFile(t *testing.T) {
	a, b := sopstest.NewIdentity(t), sopstest.NewIdentity(t)
	path := sopstest.WriteKeyFile(t, t.TempDir(), "hub.agekey", a, b)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ids, err := ParseIdentities(path, f)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids.Recipients(); len(got) != 2 || got[0] != a.Recipient().String() || got[1] != b.Recipient().String() {
		t.Fatalf("recipients = %v", got)
	}
	secret := a.String()
	_, err = ParseIdentities("broken.agekey", strings.NewReader(secret[:len(secret)-3]+"\n"))
	if err == nil || !strings.Contains(err.Error(), "broken.agekey") || strings.Contains(err.Error(), secret[:30]) {
		t.Fatalf("a broken key file gave %v; want an error naming the file and not the key", err)
	}
}
