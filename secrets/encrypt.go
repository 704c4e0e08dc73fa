package secrets

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/getsops/sops/v3"
	"github.com/getsops/sops/v3/aes"
	"github.com/getsops/sops/v3/config"
	"github.com/getsops/sops/v3/keyservice"
	sopsyaml "github.com/getsops/sops/v3/stores/yaml"
	"github.com/getsops/sops/v3/version"
)

// tokenKey is the one key of an enrollment file.
const tokenKey = "token"

// EncryptEnrollment returns the contents of an enrollment file that holds t, encrypted
// as the fleet repository's .sops.yaml says: SOPS's first creation rule whose path_regex
// matches file, relative to the directory of sopsConfig, gives the age recipients and KMS
// keys. Age recipients need nothing but their public key; KMS keys use SOPS's usual
// credential chain.
func EncryptEnrollment(sopsConfig, file string, t Token) (out []byte, err error) {
	if t.IsZero() {
		return nil, errors.New("no token to encrypt")
	}
	defer recoverInto(&err, file)
	abs, err := filepath.Abs(file)
	if err != nil {
		return nil, err
	}
	cfg, err := config.LoadCreationRuleForFile(sopsConfig, abs, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sopsConfig, err)
	}
	if cfg == nil {
		return nil, fmt.Errorf("%s: no creation_rules; add one for clusters/*/enrollment.sops.yaml with the hub's age recipient", sopsConfig)
	}
	recipients := 0
	for _, g := range cfg.KeyGroups {
		recipients += len(g)
	}
	if recipients == 0 {
		return nil, fmt.Errorf("%s: the creation rule for %s names no age recipient or KMS key", sopsConfig, file)
	}
	tree := sops.Tree{
		Branches: sops.TreeBranches{{sops.TreeItem{Key: tokenKey, Value: t.s}}},
		Metadata: sops.Metadata{
			KeyGroups:               cfg.KeyGroups,
			UnencryptedSuffix:       cfg.UnencryptedSuffix,
			EncryptedSuffix:         cfg.EncryptedSuffix,
			UnencryptedRegex:        cfg.UnencryptedRegex,
			EncryptedRegex:          cfg.EncryptedRegex,
			UnencryptedCommentRegex: cfg.UnencryptedCommentRegex,
			EncryptedCommentRegex:   cfg.EncryptedCommentRegex,
			MACOnlyEncrypted:        cfg.MACOnlyEncrypted,
			ShamirThreshold:         cfg.ShamirThreshold,
			Version:                 version.Version,
		},
		FilePath: abs,
	}
	dataKey, errs := tree.GenerateDataKeyWithKeyServices([]keyservice.KeyServiceClient{keyservice.NewLocalClient()})
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: encrypting the data key: %s", file, Redact(errors.Join(errs...).Error()))
	}
	cipher := aes.NewCipher()
	mac, err := tree.Encrypt(dataKey, cipher)
	if err != nil {
		return nil, fmt.Errorf("%s: encrypting: %s", file, Redact(err.Error()))
	}
	tree.Metadata.LastModified = time.Now().UTC()
	tree.Metadata.MessageAuthenticationCode, err = cipher.Encrypt(mac, dataKey, tree.Metadata.LastModified.Format(time.RFC3339))
	if err != nil {
		return nil, fmt.Errorf("%s: encrypting the MAC: %s", file, Redact(err.Error()))
	}
	// A rule whose encrypted_regex or suffixes do not cover "token" would write the token
	// in the clear; that must fail here, not in the leak scan of a pull request.
	if v, _ := tree.Branches[0][0].Value.(string); !strings.HasPrefix(v, "ENC[") {
		return nil, fmt.Errorf("%s: the creation rule for %s leaves the key %q unencrypted; fix its encrypted_regex or suffix settings", sopsConfig, file, tokenKey)
	}
	out, err = sopsyaml.NewStore(&config.NewStoresConfig().YAML).EmitEncryptedFile(tree)
	if err != nil {
		return nil, fmt.Errorf("%s: writing: %s", file, Redact(err.Error()))
	}
	if len(ScanBytes(file, out)) > 0 {
		return nil, fmt.Errorf("%s: the encrypted file would hold the token in the clear; not written", file)
	}
	return out, nil
}

// recoverInto turns a panic inside SOPS or age on hostile input into an error about the
// file, so that one bad file cannot take the hub down.
func recoverInto(err *error, file string) {
	if r := recover(); r != nil {
		*err = &FileError{File: file, Err: ErrMalformed, Detail: "the SOPS library failed on this file"}
	}
}
