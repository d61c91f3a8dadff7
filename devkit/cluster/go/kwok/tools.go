//go:build tools

// The commands this module builds; the build tag keeps the file out of every build.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
