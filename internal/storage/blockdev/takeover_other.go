//go:build !linux

package blockdev

import "fmt"

// ConnAlive reports that there is no connection off Linux.
func ConnAlive(conn int) error { return fmt.Errorf("%w: %v", ErrNoExport, Available()) }
