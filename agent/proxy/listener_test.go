package proxy

import (
	"errors"
	"net"
	"testing"
)

func TestListenerHoldsAtMostItsCapOfConnections(t *testing.T) {
	ln := NewListener(2)
	accepted := make(chan net.Conn, 3)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	pipe := func() net.Conn {
		a, b := net.Pipe()
		t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
		return a
	}

	for range 2 {
		if !ln.Offer(pipe()) {
			t.Fatal("a listener with room refused a connection")
		}
	}
	first := <-accepted
	<-accepted
	if ln.Offer(pipe()) {
		t.Fatal("a third connection was taken over a cap of two")
	}
	// A connection the server closes gives its place back, once however often it is
	// closed.
	_ = first.Close()
	_ = first.Close()
	if got := ln.Open(); got != 1 {
		t.Fatalf("%d connections open after one of two closed, want 1", got)
	}
	if !ln.Offer(pipe()) {
		t.Fatal("the place of a closed connection was not given back")
	}
	<-accepted

	_ = ln.Close()
	if ln.Offer(pipe()) {
		t.Error("a closed listener took a connection")
	}
	if _, ok := <-accepted; ok {
		t.Error("Accept returned a connection after Close")
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
	}
}
