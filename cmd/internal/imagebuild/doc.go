// Command imagebuild builds the container images of flotilla-hub and flotilla-agent
// without a container engine, as OCI image layout archives a user pushes with the tool
// of their choice (`make images`).
//
//	go run ./cmd/internal/imagebuild images [--out bin/images] [--platforms linux/amd64,linux/arm64] [--binaries DIR]
//	go run ./cmd/internal/imagebuild rootfs DIR
//
// # What an image holds
//
// Each image is built from nothing (no base image is pulled) out of two layers:
//
//   - the base files, the same in every image and on every platform: /etc/passwd and
//     /etc/group with root and the nonroot user and group 65532, /etc/nsswitch.conf,
//     the public roots the agent's wss:// dial trusts in /etc/ssl/certs/ca-certificates.crt
//     (where Go looks first on Linux), /tmp (mode 1777) and /home/nonroot (owned by 65532);
//   - the image's static binaries in /usr/local/bin: flotilla-hub, or flotilla-agent with
//     flotilla-components, the installer the agent runs from beside its own executable.
//
// The configuration runs the first binary as the entrypoint, as user 65532:65532 in
// /home/nonroot, with PATH=/usr/local/bin and nothing else in the environment, and carries
// the OCI labels source, version, revision, title, description and created.
//
// The roots come from the Go module golang.org/x/crypto/x509roots/fallback, pinned by
// go.sum like any other dependency, rather than from a distribution's package: the
// bundle is Mozilla's NSS trust store. A root that NSS trusts only with a constraint a PEM
// file cannot express (a distrust-after date) is left out rather than trusted without it.
//
// # Version, revision, time
//
// The images are tagged with the appVersion of charts/flotilla-hub and charts/flotilla-agent,
// which must agree, and the binaries report it in --version. The revision is the commit at
// HEAD ("unknown" outside a git checkout). The creation time is $SOURCE_DATE_EPOCH, else the
// commit time of HEAD, else the Unix epoch; never the time of the build.
//
// # Reproducible
//
// The same sources, toolchain and inputs above give the same digests and the same archive
// bytes: the binaries are built with CGO_ENABLED=0, -trimpath, -buildvcs=false (the
// revision is a label, not a property of the binaries' bytes), an empty build ID, fixed
// GOAMD64/GOARM64 levels and no GOFLAGS from the caller; tar entries are sorted, owned by
// numbers, dated at the epoch, and compressed with a gzip header that holds no name or time.
//
// # The archives
//
// bin/images/<image>-<version>.tar is an OCI image layout (oci-layout, index.json, blobs/)
// in a tar file, whose index.json names one image index with an image per platform
// (linux/amd64 and linux/arm64 by default), annotated with its tag
// (org.opencontainers.image.ref.name) and full name (io.containerd.image.name). skopeo
// reads it as oci-archive:, Docker's containerd image store and podman load it, and crane
// pushes the layout once unpacked; the Makefile's images target shows each.
//
// # Dockerfile
//
// cmd/Dockerfile builds the same images with Docker. It runs the rootfs subcommand for the
// base files, so that both ways ship the same files, and names the same paths, user and
// entrypoints, which a test compares.
package main
