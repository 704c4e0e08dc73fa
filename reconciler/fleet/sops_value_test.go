package fleet

import (
	"regexp"
	"testing"
)

// sopsValueGrammar is how SOPS writes an encrypted value, as a regular expression: the
// oracle encryptedValue, which matches by hand for speed, must agree with.
var sopsValueGrammar = regexp.MustCompile(`^ENC\[AES256_GCM,data:[A-Za-z0-9+/=]*,iv:[A-Za-z0-9+/=]+,tag:[A-Za-z0-9+/=]+,type:[a-z]+\]$`)

var encryptedValueCases = []struct {
	name, value string
	encrypted   bool
}{
	{"a value SOPS wrote", "ENC[AES256_GCM,data:cGxhY2Vob2xkZXI=,iv:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=,tag:AAAAAAAAAAAAAAAAAAAAAA==,type:str]", true},
	{"an empty string encrypted", "ENC[AES256_GCM,data:,iv:aXY=,tag:dGFn,type:str]", true},
	{"a plaintext token", "flt-enroll-7c1e0b9d4a2f-PLAINTEXT", false},
	{"the empty string", "", false},
	{"another cipher", "ENC[AES128_GCM,data:ZA==,iv:aXY=,tag:dGFn,type:str]", false},
	{"no iv", "ENC[AES256_GCM,data:ZA==,iv:,tag:dGFn,type:str]", false},
	{"no tag", "ENC[AES256_GCM,data:ZA==,iv:aXY=,tag:,type:str]", false},
	{"no type", "ENC[AES256_GCM,data:ZA==,iv:aXY=,tag:dGFn,type:]", false},
	{"an upper-case type", "ENC[AES256_GCM,data:ZA==,iv:aXY=,tag:dGFn,type:STR]", false},
	{"fields out of order", "ENC[AES256_GCM,iv:aXY=,data:ZA==,tag:dGFn,type:str]", false},
	{"a field too many", "ENC[AES256_GCM,data:ZA==,iv:aXY=,tag:dGFn,type:str,extra:x]", false},
	{"a field missing", "ENC[AES256_GCM,data:ZA==,iv:aXY=,type:str]", false},
	{"plaintext in data", "ENC[AES256_GCM,data:flt-enroll token,iv:aXY=,tag:dGFn,type:str]", false},
	{"a second bracket", "ENC[AES256_GCM,data:ZA==,iv:aXY=,tag:dGFn,type:str]]", false},
	{"no closing bracket", "ENC[AES256_GCM,data:ZA==,iv:aXY=,tag:dGFn,type:str", false},
	{"a trailing newline", "ENC[AES256_GCM,data:ZA==,iv:aXY=,tag:dGFn,type:str]\n", false},
	{"text after the value", "ENC[AES256_GCM,data:ZA==,iv:aXY=,tag:dGFn,type:str] and a token", false},
	{"text before the value", "token ENC[AES256_GCM,data:ZA==,iv:aXY=,tag:dGFn,type:str]", false},
}

func TestEncryptedValueIsWhatSOPSWrites(t *testing.T) {
	for _, tc := range encryptedValueCases {
		t.Run(tc.name, func(t *testing.T) {
			if got := encryptedValue(tc.value); got != tc.encrypted {
				t.Errorf("encryptedValue = %v, want %v", got, tc.encrypted)
			}
			if oracle := sopsValueGrammar.MatchString(tc.value); oracle != tc.encrypted {
				t.Fatalf("the grammar says %v: the case is wrong", oracle)
			}
		})
	}
}

// FuzzEncryptedValue holds the hand matcher to the grammar on any string.
func FuzzEncryptedValue(f *testing.F) {
	for _, tc := range encryptedValueCases {
		f.Add(tc.value)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := encryptedValue(s), sopsValueGrammar.MatchString(s); got != want {
			t.Fatalf("encryptedValue(%q) = %v, the grammar says %v", s, got, want)
		}
	})
}
