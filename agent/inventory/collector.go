package inventory

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
)

// DefaultDCGMTimeout bounds one read of the DCGM exporter when Options.HTTPClient is nil, so
// that an endpoint that trickles its answer cannot hold up the inventory.
const DefaultDCGMTimeout = 10 * time.Second

// maxHealthError is the longest GPUHealth.Error sent to the hub; an endpoint's malformed
// page can make a parse error as long as the page.
const maxHealthError = 512

// Options configure a Collector.
type Options struct {
	// Client lists the cluster's Nodes: a direct client, which needs RBAC to list nodes,
	// or a cache-backed reader, which also watches them.
	Client client.Reader

	// DCGMURL is a dcgm-exporter metrics endpoint; empty reads no health. dcgm-exporter
	// runs on every GPU node and reports that node's GPUs only, so a Service in front of
	// its pods (e.g. http://nvidia-dcgm-exporter.gpu-operator:9400/metrics) answers each
	// read with the GPUs of whichever node it picks; the whole cluster's health needs an
	// endpoint that aggregates the exporters.
	DCGMURL string

	// HTTPClient reads DCGMURL; nil means a client with DefaultDCGMTimeout.
	HTTPClient *http.Client
}

// Collector takes the inventory of a cluster.
type Collector struct {
	client  client.Reader
	dcgm    *url.URL
	http    *http.Client
	display string // dcgm without credentials, query or fragment, for messages
}

// NewCollector checks opts and returns a Collector.
func NewCollector(opts Options) (*Collector, error) {
	if opts.Client == nil {
		return nil, errors.New("inventory collector: no Kubernetes client")
	}
	c := &Collector{client: opts.Client, http: opts.HTTPClient}
	if opts.DCGMURL != "" {
		u, err := url.Parse(opts.DCGMURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			// The URL itself is left out: it may carry credentials.
			return nil, errors.New("inventory collector: DCGM exporter URL is not an absolute http or https URL")
		}
		c.dcgm = u
		c.display = (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
	}
	if c.http == nil {
		c.http = &http.Client{Timeout: DefaultDCGMTimeout}
	}
	return c, nil
}

// Collect lists the Nodes and, when a DCGM exporter is configured, reads it. Only a failure
// to list the Nodes fails the inventory; a DCGM exporter that cannot be read is reported in
// Health.Error, with Health.GPUs empty.
func (c *Collector) Collect(ctx context.Context) (protocol.Inventory, error) {
	// One List, unpaginated: a cache-backed Reader answers a Limit with a truncated list
	// and no continue token, which would silently drop nodes.
	var nodes corev1.NodeList
	if err := c.client.List(ctx, &nodes); err != nil {
		return protocol.Inventory{}, fmt.Errorf("listing nodes: %w", err)
	}
	inv := FromNodes(nodes.Items)
	if c.dcgm != nil {
		gpus, err := c.readDCGM(ctx)
		if err != nil {
			inv.Health = &protocol.GPUHealth{GPUs: []protocol.GPUStatus{}, Error: truncate(err.Error(), maxHealthError)}
		} else {
			inv.Health = &protocol.GPUHealth{GPUs: gpus}
		}
	}
	return inv, nil
}

func (c *Collector) readDCGM(ctx context.Context) ([]protocol.GPUStatus, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.dcgm.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("reading DCGM exporter %s: %w", c.display, err)
	}
	// dcgm-exporter serves the Prometheus text format only; asking for it keeps a proxy in
	// front of it from choosing another.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := c.http.Do(req)
	if err != nil {
		// *url.Error repeats the URL with its query, which may hold a token; the cause
		// alone, under the display URL, says what went wrong.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return nil, fmt.Errorf("reading DCGM exporter %s: %w", c.display, err)
	}
	defer func() {
		// Drained a little so that the connection can be reused; a long body is not worth it.
		_, _ = io.CopyN(io.Discard, resp.Body, 4096)
		_ = resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading DCGM exporter %s: answered %s", c.display, resp.Status)
	}
	gpus, err := ParseDCGM(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading DCGM exporter %s: %w", c.display, err)
	}
	return gpus, nil
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "…"
	cut := n - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strings.ToValidUTF8(s[:cut], "") + ellipsis
}
