// Package fleettemplate holds the fleet repository that an organization starts from, so
// that the CLI can create one without a checkout of flotilla.
package fleettemplate

import (
	"embed"
	"io/fs"
)

//go:embed fleet.yaml .sops.yaml .gitignore README.md presets clusters .github
var files embed.FS

// FS is the template's files, rooted at the repository's root. It holds no Go file.
func FS() fs.FS { return files }
