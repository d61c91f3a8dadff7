//go:build tools

// The command this module builds (devkit/kind/build.sh); the build tag keeps the file out of every build.
package tools

import (
	_ "sigs.k8s.io/kind"
)
