package components

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ImagePolicy is what the worker's administrator lets the installer run with Kueue's and
// JobSet's rights: the registries their images may come from and, optionally, the
// digests they must carry. It is set in the agent's Helm values
// (components.allowedRegistries, components.requiredDigests), never by the hub: the
// desired state names the images (Spec.Registry, Release.Digest), and the worker decides
// whether they run. The zero value allows DefaultRegistry alone and requires no digest.
//
// A registry entry is host[:port][/path], matched against the image's repository: the
// host exactly (in any case), the port exactly (registry.k8s.io:443 is not
// registry.k8s.io), and the path as a prefix ending on a "/" (mirror.example.com/k8s
// allows mirror.example.com/k8s/kueue/kueue, not mirror.example.com/k8s-old/...). There
// are no wildcards: these images run with a cluster-wide controller's rights and answer
// the API server's admission webhooks, and each registry trusted with that is named.
type ImagePolicy struct {
	// AllowedRegistries are the registries the images may come from; empty is
	// DefaultRegistry alone.
	AllowedRegistries []string `json:"allowedRegistries,omitempty"`
	// RequiredDigests are the digests images must carry, keyed by repository path and
	// tag without the registry ("kueue/kueue:v0.17.0"), whichever registry the image
	// comes from: a mirror then serves exactly the content the administrator approved.
	// An image without a key here needs no digest.
	RequiredDigests map[string]string `json:"requiredDigests,omitempty"`
}

// Reasons a component's Status gives when the policy refuses its image (Status.Reason).
const (
	// ReasonRegistryNotAllowed: an image's registry is not among the allowed ones.
	ReasonRegistryNotAllowed = "RegistryNotAllowed"
	// ReasonDigestNotAllowed: an image lacks the digest the worker requires, or names
	// another.
	ReasonDigestNotAllowed = "DigestNotAllowed"
)

// Where the policy is set, as the refusals name it for the worker's administrator.
const (
	allowedRegistriesValue = "components.allowedRegistries in the agent's Helm values"
	requiredDigestsValue   = "components.requiredDigests in the agent's Helm values"
)

// Registries are the allowed registries, normalized, in the order given; a malformed
// entry, which the agent's configuration refuses, is left out.
func (p ImagePolicy) Registries() []string {
	if len(p.AllowedRegistries) == 0 {
		return []string{DefaultRegistry}
	}
	var out []string
	for _, r := range p.AllowedRegistries {
		if n, err := ParseRegistry(r); err == nil && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// Refused says, when spec names an image p does not allow, what each component's status
// is: refused, with the first rule broken as its Reason and every problem of the state
// in its Message, for the whole desired state installs nothing. Nil when p allows every
// image of spec.
func (p ImagePolicy) Refused(spec Spec) []Status {
	var reason string
	var problems []string
	add := func(r, msg string) {
		if reason == "" {
			reason = r
		}
		if !slices.Contains(problems, msg) {
			problems = append(problems, msg)
		}
	}
	registries := p.Registries()
	registry, err := ParseRegistry(cmp.Or(spec.Registry, DefaultRegistry))
	if err != nil {
		add(ReasonRegistryNotAllowed, fmt.Sprintf("registry %q is not a registry name: %v", spec.Registry, err))
	}
	for _, c := range All() {
		rel := spec.Release(c)
		if err == nil && !allowed(registries, Repository(c, registry)) {
			add(ReasonRegistryNotAllowed, fmt.Sprintf("registry %q is not among the registries this worker allows (%s: %s); its administrator adds it there",
				registry, allowedRegistriesValue, strings.Join(registries, ", ")))
		}
		key := RepositoryPath(c) + ":" + rel.Version
		want, ok := p.RequiredDigests[key]
		switch {
		case !ok:
		case rel.Digest == "":
			add(ReasonDigestNotAllowed, fmt.Sprintf("%s's image %s carries no digest, and this worker requires %s for %s (%s); the fleet pins it with spec.components.%sDigest in fleet.yaml",
				c, spec.Image(c), want, key, requiredDigestsValue, digestField(c)))
		case rel.Digest != want:
			add(ReasonDigestNotAllowed, fmt.Sprintf("%s's image %s is not the one this worker allows: it requires %s for %s (%s)",
				c, spec.Image(c), want, key, requiredDigestsValue))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	msg := strings.Join(problems, "; ")
	out := make([]Status, 0, len(All()))
	for _, c := range All() {
		out = append(out, Status{Component: c, Version: spec.Release(c).Version, Action: ActionRefused, Reason: reason, Message: msg})
	}
	return out
}

// allowed: repository is under one of registries, on a "/".
func allowed(registries []string, repository string) bool {
	return slices.ContainsFunc(registries, func(r string) bool { return strings.HasPrefix(repository, r+"/") })
}

// digestField is the fleet.yaml field (spec.components.<field>Digest) that pins c.
func digestField(c Component) string {
	if c == JobSet {
		return "jobSet"
	}
	return string(c)
}

// maxRegistryLength bounds a registry's name: with the repository and tag after it, an
// image reference stays well inside what a container runtime accepts.
const maxRegistryLength = 200

var (
	// A path component of an image repository, as the distribution spec writes it.
	repositoryComponent = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*$`)
	digestPattern       = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	tagPattern          = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// ParseRegistry checks r, a registry and optional path (host[:port][/path], a trailing
// "/" allowed), and returns it normalized: the host in lower case, since host names are
// compared without case, and no trailing "/". The errors say what is wrong and do not
// repeat r.
func ParseRegistry(r string) (string, error) {
	if len(r) > maxRegistryLength {
		return "", errors.New("is longer than " + strconv.Itoa(maxRegistryLength) + " characters")
	}
	if strings.Contains(r, "://") {
		return "", errors.New("must be a registry host and optional path, without a scheme (e.g. mirror.example.com/k8s)")
	}
	if strings.Contains(r, "*") {
		return "", errors.New("has a wildcard; list each registry instead (e.g. mirror.example.com/k8s)")
	}
	hostPort, repoPath, _ := strings.Cut(strings.TrimSuffix(r, "/"), "/")
	hostPort = strings.ToLower(hostPort)
	host, port := hostPort, ""
	if h, p, err := net.SplitHostPort(hostPort); err == nil {
		host, port = h, p
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return "", errors.New("has an invalid port " + strconv.Quote(port))
		}
	}
	if net.ParseIP(host) == nil && len(validation.IsDNS1123Subdomain(host)) > 0 {
		return "", errors.New("must start with a registry host such as mirror.example.com")
	}
	if repoPath != "" {
		for _, c := range strings.Split(repoPath, "/") {
			if !repositoryComponent.MatchString(c) {
				return "", errors.New("has an invalid path component " + strconv.Quote(c) + ": lowercase letters, digits and separators only")
			}
		}
		return hostPort + "/" + repoPath, nil
	}
	return hostPort, nil
}

// CheckRequiredDigest checks one entry of ImagePolicy.RequiredDigests: key names an image
// the installer runs, by repository path and tag (kueue/kueue:v0.17.0), and digest is
// sha256:<64 hex digits>. A key for another image is refused rather than ignored: a
// misspelt one would otherwise require nothing.
func CheckRequiredDigest(key, digest string) error {
	path, tag, ok := strings.Cut(key, ":")
	var paths []string
	for _, c := range All() {
		paths = append(paths, RepositoryPath(c)+":<tag>")
	}
	switch {
	case !ok || !tagPattern.MatchString(tag):
		return fmt.Errorf("key %q is not a repository path and tag such as %s:%s", key, RepositoryPath(Kueue), Installable(Kueue)[0])
	case !slices.ContainsFunc(All(), func(c Component) bool { return RepositoryPath(c) == path }):
		return fmt.Errorf("key %q names no image the installer runs; it runs %s", key, strings.Join(paths, " and "))
	case !digestPattern.MatchString(digest):
		return fmt.Errorf("the digest of %s is %q, not sha256:<64 hex digits>", key, digest)
	}
	return nil
}
