package bench

import (
	"fmt"

	"github.com/prometheus/procfs"
)

// machineBusy is the CPU time, in seconds since boot, that the machine's CPUs have spent
// busy: running user or kernel code, interrupts included; idle time, time waiting for I/O
// and time the hypervisor took away (steal) are not. The difference over a job is what the
// whole machine spent while the job ran — fio, the kernel's block and FUSE layers, the
// volume target, the replica servers and their writeback — which no one process's own
// usage shows.
func machineBusy() (float64, error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, fmt.Errorf("reading /proc: %w", err)
	}
	st, err := fs.Stat()
	if err != nil {
		return 0, fmt.Errorf("reading /proc/stat: %w", err)
	}
	t := st.CPUTotal
	return t.User + t.Nice + t.System + t.IRQ + t.SoftIRQ, nil
}
