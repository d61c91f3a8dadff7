//go:build tools

// The commands this module builds; the build tag keeps the file out of every build.
// test/copyimg is CRI-O's own image copier (containers/image into containers/storage), built with the same tags:
// the lane imports its images into CRI-O's storage with it (no registry).
package tools

import (
	_ "github.com/cri-o/cri-o/cmd/crio"
	_ "github.com/cri-o/cri-o/test/copyimg"
)
