//go:build tools

// The command this module builds (build.sh beside it); the build tag keeps the file out of every build.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
