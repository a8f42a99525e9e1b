package controlplane

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/crdipc/crdipc/internal/safefile"
	"k8s.io/klog/v2"
)

var logsOnce sync.Once

// redirectLogs sends klog (used by kube-apiserver and the controllers) to a
// file in the first data dir used: their output is for debugging, not for the terminal
// of a user who ran `crdipc up`. klog is process-wide, so this happens once.
func redirectLogs(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating log dir: %w", err)
	}
	var err error
	logsOnce.Do(func() {
		var f *os.File
		f, err = safefile.OpenFile(filepath.Join(dir, "control-plane.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			err = fmt.Errorf("opening control plane log: %w", err)
			return
		}
		fs := flag.NewFlagSet("klog", flag.ContinueOnError)
		klog.InitFlags(fs)
		_ = fs.Set("logtostderr", "false")
		_ = fs.Set("alsologtostderr", "false")
		_ = fs.Set("stderrthreshold", "FATAL")
		_ = fs.Set("one_output", "true")
		klog.SetOutput(f)
	})
	return err
}
