package dispatchtest

import (
	"errors"
	"io"
	"net"
	"sync"
)

// Service plays a Kubernetes Service in front of a hub's replicas, where no kube-proxy
// runs: one stable address whose new connections go to the endpoint it routes to now,
// while a connection already made stays with the endpoint it reached. Drop plays that
// endpoint's Pod going away: the connections it held end, as they would on a node
// whose Pod was deleted or crashed, and nothing reaches it any more.
type Service struct {
	l net.Listener

	mu     sync.Mutex
	target string                       // "" routes nowhere: new connections are refused
	conns  map[string]map[net.Conn]bool // by endpoint: both ends of each connection
	closed bool
}

// NewService serves on a loopback port of its own, routing nowhere until Route.
func NewService() (*Service, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Service{l: l, conns: map[string]map[net.Conn]bool{}}
	go s.serve()
	return s, nil
}

// Addr is the Service's address, host:port.
func (s *Service) Addr() string { return s.l.Addr().String() }

// Route sends the connections made from now on to endpoint (host:port); "" to none.
func (s *Service) Route(endpoint string) {
	s.mu.Lock()
	s.target = endpoint
	s.mu.Unlock()
}

// Drop ends every connection held by endpoint and routes nowhere if it routed there.
func (s *Service) Drop(endpoint string) {
	s.mu.Lock()
	held := s.conns[endpoint]
	delete(s.conns, endpoint)
	if s.target == endpoint {
		s.target = ""
	}
	s.mu.Unlock()
	for c := range held {
		_ = c.Close()
	}
}

// Close stops the Service and ends every connection through it.
func (s *Service) Close() {
	s.mu.Lock()
	s.closed = true
	all := s.conns
	s.conns = map[string]map[net.Conn]bool{}
	s.mu.Unlock()
	_ = s.l.Close()
	for _, held := range all {
		for c := range held {
			_ = c.Close()
		}
	}
}

func (s *Service) serve() {
	for {
		in, err := s.l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		go s.forward(in)
	}
}

// forward joins in to the endpoint routed to now, or refuses it, as a Service without
// ready endpoints does.
func (s *Service) forward(in net.Conn) {
	s.mu.Lock()
	target := s.target
	s.mu.Unlock()
	if target == "" {
		_ = in.Close()
		return
	}
	out, err := net.Dial("tcp", target)
	if err != nil {
		_ = in.Close()
		return
	}
	s.mu.Lock()
	// Dropped, or routed elsewhere, while dialling: as a connection to a Pod that went.
	if s.closed || s.target != target {
		s.mu.Unlock()
		_ = in.Close()
		_ = out.Close()
		return
	}
	if s.conns[target] == nil {
		s.conns[target] = map[net.Conn]bool{}
	}
	s.conns[target][in], s.conns[target][out] = true, true
	s.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		_ = dst.Close()
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
	s.mu.Lock()
	delete(s.conns[target], in)
	delete(s.conns[target], out)
	s.mu.Unlock()
}
