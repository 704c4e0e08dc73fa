package logtest

import "testing"

func TestABoundedBufferKeepsTheLatestBytes(t *testing.T) {
	b := &Buffer{Max: 8}
	for _, s := range []string{"first line\n", "second\n", "third\n"} {
		if _, err := b.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if got := b.String(); got != "d\nthird\n" {
		t.Errorf("kept %q, want the last 8 bytes %q", got, "d\nthird\n")
	}
	if got := b.Last(6); got != "third\n" {
		t.Errorf("Last(6) = %q, want %q", got, "third\n")
	}
	if got := b.Last(100); got != "d\nthird\n" {
		t.Errorf("Last(100) = %q, want all that is kept", got)
	}
}

func TestAnUnboundedBufferKeepsEverything(t *testing.T) {
	var b Buffer
	_, _ = b.Write([]byte("a\n"))
	_, _ = b.Write([]byte("b\n"))
	if got := b.String(); got != "a\nb\n" {
		t.Errorf("kept %q, want everything written", got)
	}
}
