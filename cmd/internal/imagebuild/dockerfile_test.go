package main

import (
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	Cmd  string // upper case
	Args string
}

// stage is one FROM ... AS name and what follows it.
type stage struct {
	Name, From string
	Ins        []instruction
}

// parseDockerfile reads the instructions of a Dockerfile, by stage. Enough of the syntax
// for the file this package keeps beside the builder: comments, continuation lines.
func parseDockerfile(text string) []stage {
	var stages []stage
	var pending string
	for line := range strings.SplitSeq(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && pending == "") {
			continue
		}
		if cont, ok := strings.CutSuffix(trimmed, "\\"); ok {
			pending += cont + " "
			continue
		}
		full := strings.TrimSpace(pending + trimmed)
		pending = ""
		if full == "" {
			continue
		}
		cmd, args, _ := strings.Cut(full, " ")
		in := instruction{Cmd: strings.ToUpper(cmd), Args: strings.Join(strings.Fields(args), " ")}
		if in.Cmd == "FROM" {
			f := strings.Fields(in.Args)
			f = slices.DeleteFunc(f, func(s string) bool { return strings.HasPrefix(s, "--") })
			st := stage{From: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.Name = f[2]
			}
			stages = append(stages, st)
			continue
		}
		if len(stages) > 0 {
			stages[len(stages)-1].Ins = append(stages[len(stages)-1].Ins, in)
		}
	}
	return stages
}

// chain is a target's instructions, those of the stages it is built FROM first, and the
// image the first of them starts from.
func chain(stages []stage, target string) (from string, ins []instruction, ok bool) {
	for _, st := range stages {
		if st.Name != target {
			continue
		}
		from, base, found := chain(stages, st.From)
		if !found {
			from = st.From
		}
		return from, append(base, st.Ins...), true
	}
	return "", nil, false
}

var labelPair = regexp.MustCompile(`([A-Za-z0-9_.\-]+)=("(?:[^"\\]|\\.)*"|\S+)`)

// Teams that build with Docker get the images `make images` ships: same entrypoints,
// user, working directory, environment, paths, labels, build flags and version.
func TestDockerfileBuildsWhatTheBuilderBuilds(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "cmd", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	version, err := appVersion(filepath.Join(root, charts[0]))
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(string(b))

	for _, img := range images() {
		target := strings.TrimPrefix(img.Name, "flotilla-")
		t.Run(target, func(t *testing.T) {
			from, ins, ok := chain(stages, target)
			if !ok {
				t.Fatalf("no stage %s", target)
			}
			if from != "scratch" {
				t.Errorf("the %s image starts FROM %s, want scratch", target, from)
			}
			last := func(cmd string) string {
				v := ""
				for _, in := range ins {
					if in.Cmd == cmd {
						v = in.Args
					}
				}
				return v
			}
			var entrypoint []string
			if err := json.Unmarshal([]byte(last("ENTRYPOINT")), &entrypoint); err != nil || !slices.Equal(entrypoint, img.Entrypoint()) {
				t.Errorf("ENTRYPOINT %s (%v), want %q", last("ENTRYPOINT"), err, img.Entrypoint())
			}
			if got := last("USER"); got != user() {
				t.Errorf("USER %s, want %s", got, user())
			}
			if got := last("WORKDIR"); got != homeDir {
				t.Errorf("WORKDIR %s, want %s", got, homeDir)
			}
			var envs []string
			got := map[string]string{}
			var copies []instruction
			for _, in := range ins {
				switch in.Cmd {
				case "ENV":
					envs = append(envs, in.Args)
				case "LABEL":
					for _, m := range labelPair.FindAllStringSubmatch(in.Args, -1) {
						v := m[2]
						if uq, err := strconv.Unquote(v); err == nil {
							v = uq
						}
						got[m[1]] = v
					}
				case "COPY":
					copies = append(copies, in)
				}
			}
			if !slices.Equal(envs, env()) {
				t.Errorf("ENV %q, want %q", envs, env())
			}
			want := map[string]string{
				labelSource:      sourceURL,
				labelVersion:     "${VERSION}",
				labelRevision:    "${REVISION}",
				labelTitle:       img.Name,
				labelDescription: img.Description,
				labelCreated:     "${CREATED}",
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("LABEL %s=%q, want %q", k, got[k], v)
				}
			}
			if len(got) != len(want) {
				t.Errorf("LABELs %v, want the builder's %v", got, want)
			}

			copied := func(src, dst string, flags ...string) bool {
				for _, c := range copies {
					f := strings.Fields(c.Args)
					if len(f) < 2 || f[len(f)-1] != dst || !slices.Contains(f, "--from=build") {
						continue
					}
					if slices.ContainsFunc(f[:len(f)-1], func(s string) bool { return s == src || strings.HasSuffix(s, "/"+src) }) &&
						!slices.ContainsFunc(flags, func(fl string) bool { return !slices.Contains(f, fl) }) {
						return true
					}
				}
				return false
			}
			for _, c := range img.Commands {
				if !copied(c, path.Join(binDir, c)) {
					t.Errorf("no COPY --from=build of %s to %s", c, path.Join(binDir, c))
				}
			}
			if !copied("/rootfs/", "/") {
				t.Errorf("no COPY --from=build /rootfs/ / of the base files")
			}
			for _, e := range baseFiles() {
				if e.UID == 0 && e.GID == 0 {
					continue
				}
				chown := "--chown=" + strconv.Itoa(e.UID) + ":" + strconv.Itoa(e.GID)
				if !slices.ContainsFunc(copies, func(c instruction) bool {
					f := strings.Fields(c.Args)
					return slices.Contains(f, chown) && f[len(f)-1] == e.Path+"/"
				}) {
					t.Errorf("no COPY %s of %s, which rootfs leaves to the Dockerfile", chown, e.Path)
				}
			}
		})
	}

	t.Run("build", func(t *testing.T) {
		_, ins, ok := chain(stages, "build")
		if !ok {
			t.Fatal("no build stage")
		}
		var runs, args []string
		for _, in := range ins {
			switch in.Cmd {
			case "RUN":
				runs = append(runs, in.Args)
			case "ARG":
				args = append(args, in.Args)
			}
		}
		all := strings.Join(runs, "\n")
		if !strings.Contains(all, "go run ./cmd/internal/imagebuild rootfs /rootfs") {
			t.Errorf("the build stage does not write the base files with imagebuild rootfs:\n%s", all)
		}
		var build string
		for _, r := range runs {
			if strings.Contains(r, "go build") {
				build = r
			}
		}
		flags := buildFlags("${VERSION}")
		for i, f := range flags {
			if strings.Contains(f, " ") {
				flags[i] = strconv.Quote(f)
			}
		}
		wantInBuild := append(flags, "GOOS=$TARGETOS", "GOARCH=$TARGETARCH")
		for _, e := range buildEnv(v1.Platform{}) {
			if k, _, _ := strings.Cut(e, "="); k != "GOOS" && k != "GOARCH" {
				wantInBuild = append(wantInBuild, e+" ")
			}
		}
		for _, c := range commandsOf(images()) {
			wantInBuild = append(wantInBuild, "./cmd/"+c)
		}
		for _, w := range wantInBuild {
			if !strings.Contains(build+" ", w) {
				t.Errorf("the go build of the Dockerfile lacks %s:\n%s", w, build)
			}
		}
		if !slices.Contains(args, "VERSION="+version) {
			t.Errorf("the build stage's ARGs %q lack VERSION=%s, the charts' appVersion", args, version)
		}
	})

	// Every default VERSION is the charts' appVersion.
	for _, st := range stages {
		for _, in := range st.Ins {
			if v, ok := strings.CutPrefix(in.Args, "VERSION="); in.Cmd == "ARG" && ok && v != version {
				t.Errorf("stage %s: ARG VERSION=%s, want the charts' appVersion %s", st.Name, v, version)
			}
		}
	}
}
