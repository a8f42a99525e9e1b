package blockdev

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSequentialThroughput measures sequential throughput through the loop device with dd
// (one 1 MiB request at a time) and, if installed, fio (libaio, 16 requests in flight). It
// moves several GiB, so it runs only with CRDIPC_BLOCKDEV_BENCH=1; run it with -v to see
// the numbers.
func TestSequentialThroughput(t *testing.T) {
	if os.Getenv("CRDIPC_BLOCKDEV_BENCH") != "1" {
		t.Skip("set CRDIPC_BLOCKDEV_BENCH=1 to measure throughput")
	}
	requireMount(t, "dd")
	_, err := exec.LookPath("fio")
	haveFio := err == nil
	cases := []struct {
		name string
		mib  int
		dev  func(t *testing.T, size int64) Device
		o    Options
	}{
		{"mem/directio=auto/maxwrite=1M", 1024, memDev, Options{}},
		{"mem/directio=off/maxwrite=1M", 1024, memDev, Options{DirectIO: DirectIOOff}},
		{"mem/directio=auto/maxwrite=128K", 1024, memDev, Options{MaxWrite: 128 << 10}},
		{"file/directio=auto/maxwrite=1M", 1024, fileDev, Options{}},
		{"mem+5ms/directio=auto/maxwrite=1M", 128, slowMemDev, Options{}},
		{"mem+5ms/directio=off/maxwrite=1M", 128, slowMemDev, Options{DirectIO: DirectIOOff}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			size := int64(c.mib) << 20
			e := export(t, c.dev(t, size), c.o)
			t.Logf("%s: loop direct I/O %v", e.Device(), e.DirectIO())
			count := fmt.Sprint(c.mib)
			t.Logf("dd write: %s", ddRate(t, "if=/dev/zero", "of="+e.Device(), "bs=1M", "count="+count, "oflag=direct", "conv=fsync"))
			t.Logf("dd read:  %s", ddRate(t, "if="+e.Device(), "of=/dev/null", "bs=1M", "count="+count, "iflag=direct"))
			if haveFio {
				t.Logf("fio write (QD16): %s", fioRate(t, e.Device(), "write", size))
				t.Logf("fio read  (QD16): %s", fioRate(t, e.Device(), "read", size))
			}
		})
	}
}

// memDev touches every page up front: first-touch page faults are slow in these VMs and would
// otherwise dominate the first write pass.
func memDev(t *testing.T, size int64) Device {
	buf := make([]byte, size)
	for i := 0; i < len(buf); i += 4096 {
		buf[i] = 1
	}
	return &memDevice{buf: buf}
}

func fileDev(t *testing.T, size int64) Device {
	return newFileDevice(t, filepath.Join(t.TempDir(), "backing.img"), size)
}

// slowMemDev stands in for a replicated Device whose every request costs a network round
// trip; it shows what requests in flight at once are worth.
func slowMemDev(t *testing.T, size int64) Device {
	return &latencyDevice{Device: memDev(t, size), latency: 5 * time.Millisecond}
}

type latencyDevice struct {
	Device
	latency time.Duration
}

// The sleeps simulate service time, they do not wait for anything.
func (d *latencyDevice) ReadAt(p []byte, off int64) (int, error) {
	time.Sleep(d.latency)
	return d.Device.ReadAt(p, off)
}

func (d *latencyDevice) WriteAt(p []byte, off int64) (int, error) {
	time.Sleep(d.latency)
	return d.Device.WriteAt(p, off)
}

// ddRate runs dd and returns its summary line ("... copied, 1.2 s, 895 MB/s").
func ddRate(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("dd", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("dd %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

func fioRate(t *testing.T, dev, rw string, size int64) string {
	t.Helper()
	out, err := exec.Command("fio", "--name=seq", "--filename="+dev, "--rw="+rw, "--bs=1M",
		fmt.Sprintf("--size=%d", size), "--ioengine=libaio", "--iodepth=16", "--direct=1",
		"--end_fsync=1", "--output-format=json").Output()
	if err != nil {
		t.Fatalf("fio %s: %v", rw, err)
	}
	var res struct {
		Jobs []struct {
			Read, Write struct {
				BW float64 `json:"bw_bytes"`
			}
		}
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Jobs) != 1 {
		t.Fatalf("fio output: %v\n%s", err, out)
	}
	bw := res.Jobs[0].Read.BW + res.Jobs[0].Write.BW
	return fmt.Sprintf("%.0f MB/s", bw/1e6)
}
