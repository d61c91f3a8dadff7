//go:build tools

// The command this module builds (tools/build-promtool.sh); the build tag keeps the file out of every build.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
