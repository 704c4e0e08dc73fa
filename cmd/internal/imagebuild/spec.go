package main

import (
	"path"
	"strconv"

	"github.com/flotilla-gitops/flotilla/agent/components"
)

// The file system and identity every image shares; cmd/Dockerfile names the same.
const (
	// binDir holds the binaries; the agent finds its installer beside itself there.
	binDir = "/usr/local/bin"
	// nonroot is the user and group the images run as, distroless's nonroot.
	nonroot = 65532
	// homeDir is nonroot's home and the working directory.
	homeDir = "/home/nonroot"
	// caFile is where Go's crypto/x509 looks first on Linux, so no SSL_CERT_FILE is set,
	// and an operator may still point SSL_CERT_FILE or SSL_CERT_DIR elsewhere.
	caFile = "/etc/ssl/certs/ca-certificates.crt"
	// sourceURL is the org.opencontainers.image.source label.
	sourceURL = "https://github.com/flotilla-gitops/flotilla"
	// defaultRegistry prefixes the image names recorded in the archives, as the charts'
	// default image repositories do.
	defaultRegistry = "ghcr.io/flotilla-gitops"
)

// image is one image the builder makes.
type image struct {
	// Name is the repository's last element and the archive's name.
	Name string
	// Description is the org.opencontainers.image.description label.
	Description string
	// Commands are the directories under cmd/ whose binaries go into binDir; the first
	// is the entrypoint.
	Commands []string
}

// images are the images `make images` builds.
func images() []image {
	return []image{
		{
			Name:        "flotilla-hub",
			Description: "The flotilla hub, which follows fleet repositories and serves the agents of their GPU worker clusters.",
			Commands:    []string{"flotilla-hub"},
		},
		{
			Name:        "flotilla-agent",
			Description: "The flotilla agent, which runs in a GPU worker cluster, dials the hub and applies the cluster's Kueue objects.",
			// The agent runs its installer from beside its own executable
			// (components.BesideExecutable).
			Commands: []string{"flotilla-agent", components.BinaryName},
		},
	}
}

// Entrypoint is the image's entrypoint.
func (i image) Entrypoint() []string { return []string{path.Join(binDir, i.Commands[0])} }

// user is the configuration's User: numeric, so that a runtime needs no /etc/passwd to
// resolve it and Kubernetes' runAsNonRoot can verify it.
func user() string { return strconv.Itoa(nonroot) + ":" + strconv.Itoa(nonroot) }

// env is the whole environment of the configuration: nothing that could carry a secret.
func env() []string { return []string{"PATH=" + binDir} }
