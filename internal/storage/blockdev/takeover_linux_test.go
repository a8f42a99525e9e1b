package blockdev

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/crdipc/crdipc/internal/testenv/records"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// TestReleaseAndAdopt: the export is handed from one server to the next three times while a
// writer on the loop device syncs a record after every write; no write fails, and every
// record is on the Device afterwards.
func TestReleaseAndAdopt(t *testing.T) {
	requireMount(t)
	dev := newFileDevice(t, filepath.Join(t.TempDir(), "backing.img"), 64<<20)
	o := Options{Logger: quietLogger(), DirectIO: DirectIOOn}
	e := export(t, dev, o)
	dir := filepath.Dir(e.File())
	abortIfStuck(t, e.File())
	w := startWriter(t, e.Device(), e.File())

	for round := 1; round <= 3; round++ {
		wantAcked(t, w, 50*round)
		conn, err := e.Conn()
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Release(); err != nil {
			t.Fatalf("round %d: release: %v", round, err)
		}
		if err := e.Close(); err != nil {
			t.Fatalf("round %d: close after release: %v", round, err)
		}
		if !isMountPoint(t, dir) {
			t.Fatalf("round %d: the FUSE mount went with the released server", round)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		next, err := Adopt(ctx, dev, dir, e.Device(), conn, o)
		cancel()
		if err != nil {
			t.Fatalf("round %d: adopt: %v", round, err)
		}
		if next.Device() != e.Device() || !next.DirectIO() {
			t.Fatalf("round %d: adopted %s (direct I/O %v), want %s", round, next.Device(), next.DirectIO(), e.Device())
		}
		e = next
	}
	wantAcked(t, w, 200)
	n := stopWriter(t, w)
	t.Logf("%d records, the longest write+fsync %s", n, w.MaxPause())
	if err := records.Verify(dev.f, n); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("close the last server: %v", err)
	}
	if isMountPoint(t, dir) {
		t.Fatal("still mounted after the last server closed")
	}
}

// TestAdoptAfterKill: the serving process is SIGKILLed in the middle of the writer's
// records, twice, each time holding a FSYNC it has read and not answered; this process holds the
// connection, and a new process adopts it. The kernel resends what the dead one had read:
// the writer pauses, no write fails, and every record is on the Device.
func TestAdoptAfterKill(t *testing.T) {
	requireMount(t)
	backing := filepath.Join(t.TempDir(), "backing.img")
	dev := newFileDevice(t, backing, 64<<20) // for Verify; the helpers open the file too
	dir := filepath.Join(t.TempDir(), "export")
	file := filepath.Join(dir, VolumeName)
	abortIfStuck(t, file)
	t.Cleanup(func() {
		if err := Cleanup(dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})

	first, held, loop, conn := startTakeoverHelper(t, backing, dir, "", -1, heldFlush)
	w := startWriter(t, loop, file)
	for round := 1; round <= 2; round++ {
		// Kill while a FSYNC is read and unanswered: the helper holds one and says so.
		select {
		case <-held:
		case <-time.After(2 * time.Minute):
			t.Fatalf("round %d: the helper never held a flush (%d records acknowledged)", round, w.Acked())
		}
		if err := first.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = first.Wait()
		if err := w.Err(); err != nil {
			t.Fatalf("round %d: a write failed while nothing served: %v", round, err)
		}
		hold := heldFlush
		if round == 2 {
			hold = 0 // the last one serves to the end
		}
		first, held, _, conn = startTakeoverHelper(t, backing, dir, loop, conn, hold)
	}
	wantAcked(t, w, 300)
	n := stopWriter(t, w)
	t.Logf("%d records through 2 SIGKILLs, the longest write+fsync %s", n, w.MaxPause())
	if err := records.Verify(dev.f, n); err != nil {
		t.Fatal(err)
	}
	unix.Close(conn)
	_ = first.Process.Signal(syscall.SIGTERM) // closes its export
	if err := first.Wait(); err != nil {
		t.Errorf("last helper: %v", err)
	}
}

const (
	takeoverEnv     = "CRDIPC_BLOCKDEV_TAKEOVER" // "backing file|dir|adopt"
	takeoverLoopEnv = "CRDIPC_BLOCKDEV_TAKEOVER_LOOP"
	takeoverHoldEnv = "CRDIPC_BLOCKDEV_TAKEOVER_HOLD" // the flush to hold, 0 none
	// heldFlush is the flush a helper holds: far enough in for records to be flowing.
	heldFlush = 50
)

// takeoverHelper is the process TestAdoptAfterKill kills: it exports a file-backed Device
// at dir, or adopts the connection at fd 3, prints the loop device and the connection's
// descriptor (sent on fd 4 when exporting), and serves until killed or SIGTERM (Close).
// It never answers its takeoverHoldEnv'th flush, and prints HELD when it has it: a kill
// then lands while a request is read and unanswered, the case NOTIFY_RESEND is for.
func takeoverHelper(spec string) {
	backing, rest, _ := strings.Cut(spec, "|")
	dir, mode, _ := strings.Cut(rest, "|")
	f, err := os.OpenFile(backing, os.O_RDWR, 0)
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	fi, _ := f.Stat()
	hold, _ := strconv.ParseInt(os.Getenv(takeoverHoldEnv), 10, 64)
	dev := &holdingDevice{fileDevice: &fileDevice{f: f, size: fi.Size()}, hold: hold}
	ctx := context.Background()
	o := Options{Logger: quietLogger(), DirectIO: DirectIOOn}
	var e *Exported
	if mode == "adopt" {
		e, err = Adopt(ctx, dev, dir, os.Getenv(takeoverLoopEnv), 3, o)
	} else {
		e, err = Export(ctx, dev, dir, o)
		if err == nil {
			err = sendConn(e)
		}
	}
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	fmt.Println("DEVICE", e.Device())
	sig := make(chan os.Signal, 1)
	signalNotify(sig)
	<-sig
	if err := e.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "close:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// sendConn passes a descriptor of e's connection over the socket at fd 4.
func sendConn(e *Exported) error {
	c, err := e.Conn()
	if err != nil {
		return err
	}
	defer unix.Close(c)
	return unix.Sendmsg(4, []byte{0}, unix.UnixRights(c), nil, 0)
}

// holdingDevice never returns from its hold'th Flush (0: none), after printing HELD.
type holdingDevice struct {
	*fileDevice
	hold    int64
	flushes atomic.Int64
}

func (d *holdingDevice) Flush() error {
	if n := d.flushes.Add(1); n == d.hold {
		fmt.Println("HELD")
		select {} // until killed
	}
	return d.fileDevice.Flush()
}

// startTakeoverHelper starts a helper that exports (conn < 0) or adopts conn and holds its
// hold'th flush, waits until it serves, and returns it, a channel closed when it holds the
// flush, its loop device, and this process's descriptor of the connection.
func startTakeoverHelper(t *testing.T, backing, dir, loop string, conn int, hold int) (*exec.Cmd, <-chan struct{}, string, int) {
	t.Helper()
	mode := "export"
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	var sock [2]int
	if conn >= 0 {
		mode = "adopt"
		// os.NewFile + ExtraFiles would call Fd, which makes the description blocking;
		// Adopt makes it non-blocking again, which this tests too.
		cmd.ExtraFiles = []*os.File{os.NewFile(uintptr(dupFD(t, conn)), "fuse")}
	} else {
		var err error
		if sock, err = unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0); err != nil {
			t.Fatal(err)
		}
		cmd.ExtraFiles = []*os.File{os.NewFile(uintptr(dupFD(t, sock[1])), "unused"), os.NewFile(uintptr(sock[1]), "sock")}
		defer unix.Close(sock[0])
	}
	cmd.Env = append(os.Environ(), takeoverEnv+"="+backing+"|"+dir+"|"+mode, takeoverLoopEnv+"="+loop,
		takeoverHoldEnv+"="+strconv.Itoa(hold))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for _, f := range cmd.ExtraFiles {
		f.Close()
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	r := bufio.NewReader(out)
	line, err := r.ReadString('\n')
	loop, ok := strings.CutPrefix(strings.TrimSpace(line), "DEVICE ")
	if err != nil || !ok {
		t.Fatalf("helper (%s): %q, %v", mode, line, err)
	}
	held := make(chan struct{})
	go func() {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if strings.TrimSpace(line) == "HELD" {
				close(held)
			}
		}
	}()
	if conn < 0 {
		conn = recvConn(t, sock[0])
	}
	return cmd, held, loop, conn
}

func recvConn(t *testing.T, sock int) int {
	t.Helper()
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(sock, make([]byte, 1), oob, 0)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("control message: %v (%d)", err, len(msgs))
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("rights: %v %v", err, fds)
	}
	return fds[0]
}

func dupFD(t *testing.T, fd int) int {
	t.Helper()
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func startWriter(t *testing.T, loop, file string) *records.Writer {
	t.Helper()
	w, err := records.Start(loop)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Stop(time.Minute); err != nil {
			abortConn(t, file)
		}
	})
	return w
}

// wantAcked waits for n records and fails on a write error.
func wantAcked(t *testing.T, w *records.Writer, n int) {
	t.Helper()
	wait.Eventually(t, 2*time.Minute, fmt.Sprintf("%d records acknowledged", n), func(context.Context) (bool, error) {
		if err := w.Err(); err != nil {
			t.Fatalf("a write failed: %v", err)
		}
		if got := w.Acked(); got < n {
			return false, fmt.Errorf("%d acknowledged", got)
		}
		return true, nil
	})
}

func stopWriter(t *testing.T, w *records.Writer) int {
	t.Helper()
	if err := w.Stop(time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	return w.Acked()
}

// abortIfStuck aborts the FUSE connection of file's mount when the test fails or runs for
// longer than it ever should, so that a failed handover ends in errors rather than a hang:
// with this process holding the connection, nothing else would end it, and a thread of
// it blocked on the loop device would keep it from even exiting.
func abortIfStuck(t *testing.T, file string) {
	t.Helper()
	timer := time.AfterFunc(3*time.Minute, func() {
		t.Errorf("still running after 3 minutes: aborting the FUSE connection")
		abortConn(t, file)
	})
	t.Cleanup(func() {
		timer.Stop()
		if t.Failed() {
			abortConn(t, file)
		}
	})
}

// abortConn aborts the connection of file's mount.
func abortConn(t *testing.T, file string) {
	if err := records.AbortFUSE(filepath.Dir(file)); err != nil {
		t.Logf("%v", err)
		return
	}
	t.Logf("aborted the FUSE connection of %s", file)
}

func signalNotify(c chan os.Signal) { signal.Notify(c, syscall.SIGTERM) }

// TestAbortFUSEEndsAHeldConnection: the failsafe of these tests. With no server and this
// process holding the connection, I/O on the loop device would wait forever; aborted
// through fusectl (records.AbortFUSE), it fails instead, and the export can be cleaned up.
func TestAbortFUSEEndsAHeldConnection(t *testing.T) {
	requireMount(t)
	dev := newFileDevice(t, filepath.Join(t.TempDir(), "backing.img"), 4<<20)
	dir := filepath.Join(t.TempDir(), "export")
	e, err := Export(context.Background(), dev, dir, Options{Logger: quietLogger(), DirectIO: DirectIOOn})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := e.Conn()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(conn)
	if err := e.Release(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Cleanup(dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	read := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(e.Device(), os.O_RDONLY|unix.O_DIRECT, 0)
		if err == nil {
			buf := make([]byte, 2*records.Size)
			_, err = f.ReadAt(buf[records.Size-int(uintptr(unsafe.Pointer(&buf[0]))%records.Size):][:records.Size], 0)
			f.Close()
		}
		read <- err
	}()
	if err := records.AbortFUSE(dir); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-read:
		if err == nil {
			t.Fatal("a read of the loop device succeeded with no server")
		}
	case <-time.After(time.Minute):
		t.Fatal("a read of the loop device still waits after the abort")
	}
}

// TestAdoptExecutesNothingTwice: a graceful handover, many times over, while a writer's next
// request waits in the kernel. The released server answered all it read, so the successor's
// NOTIFY_RESEND must move nothing: had the successor's readers read the waiting request
// before the resend, the kernel would send it again and the Device would execute it twice
// (and the first answer, to a unique the resend renamed, would be lost). The race is one
// reader against one syscall, so it takes many rounds: with the readers started before
// the resend, 4 runs in 5 failed within 500.
func TestAdoptExecutesNothingTwice(t *testing.T) {
	requireMount(t)
	dev := &countingDevice{fileDevice: newFileDevice(t, filepath.Join(t.TempDir(), "backing.img"), 64<<20), at: map[int64]int{}}
	o := Options{Logger: quietLogger(), DirectIO: DirectIOOn}
	e := export(t, dev, o)
	dir := filepath.Dir(e.File())
	abortIfStuck(t, e.File())
	w := startWriter(t, e.Device(), e.File())

	const rounds = 1000
	for round := 1; round <= rounds; round++ {
		// The writer's next request is on its way while no server reads.
		wantAcked(t, w, w.Acked()+1)
		conn, err := e.Conn()
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Release(); err != nil {
			t.Fatalf("round %d: release: %v", round, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		next, err := Adopt(ctx, dev, dir, e.Device(), conn, o)
		cancel()
		if err != nil {
			t.Fatalf("round %d: adopt: %v", round, err)
		}
		t.Cleanup(func() { _ = next.Close() })
		e = next
		if off, n := dev.repeated(); n > 0 {
			t.Fatalf("round %d: the write at %d was executed %d times", round, off, n)
		}
	}
	n := stopWriter(t, w)
	if off, times := dev.repeated(); times > 0 {
		t.Fatalf("the write at %d was executed %d times", off, times)
	}
	t.Logf("%d records through %d handovers, each written once", n, rounds)
	if err := records.Verify(dev.f, n); err != nil {
		t.Fatal(err)
	}
}

// countingDevice counts the writes at each offset.
type countingDevice struct {
	*fileDevice
	mu sync.Mutex
	at map[int64]int
}

func (d *countingDevice) WriteAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	d.at[off]++
	d.mu.Unlock()
	return d.fileDevice.WriteAt(p, off)
}

// repeated is an offset written more than once and how often, or 0 times.
func (d *countingDevice) repeated() (int64, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for off, n := range d.at {
		if n > 1 {
			return off, n
		}
	}
	return 0, 0
}

// TestExistsRefusesAnotherExportsDetachedLoop: sysfs names the file of a loop device bound
// through a mount that has gone (a gone container's) only as /volume, whichever export it
// is. Such a loop device is not dir's while another one is bound to dir's file itself.
func TestExistsRefusesAnotherExportsDetachedLoop(t *testing.T) {
	requireMount(t, "losetup")
	o := Options{Logger: quietLogger(), DirectIO: DirectIOOn}
	mine := export(t, newFileDevice(t, filepath.Join(t.TempDir(), "mine.img"), 4<<20), o)
	other := export(t, newFileDevice(t, filepath.Join(t.TempDir(), "other.img"), 4<<20), o)
	// A second loop device on the other export's file, bound through a bind mount that is
	// then detached, as a gone container's mount is.
	bind := filepath.Join(t.TempDir(), "bind")
	if err := os.Mkdir(bind, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(filepath.Dir(other.File()), bind, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	detached := strings.TrimSpace(command(t, "losetup", "--find", "--show", filepath.Join(bind, VolumeName)))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", detached).Run() })
	if err := unix.Unmount(bind, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if bf, _ := loopBackingFile(filepath.Base(detached)); bf != "/"+VolumeName {
		t.Fatalf("%s's backing file %q, want the detached /%s", detached, bf, VolumeName)
	}
	dir := filepath.Dir(mine.File())
	if err := Exists(dir, detached); !errors.Is(err, ErrNoExport) {
		t.Errorf("Exists(%s, %s), another export's detached loop device: %v, want ErrNoExport", dir, detached, err)
	}
	if err := Exists(dir, mine.Device()); err != nil {
		t.Errorf("Exists(%s, %s), its own: %v", dir, mine.Device(), err)
	}
}

// TestConnAlive: a served connection is alive; one that was never mounted, or whose mount
// has gone, is not, and Adopt refuses it rather than serve nothing.
func TestConnAlive(t *testing.T) {
	requireMount(t)
	dev := newFileDevice(t, filepath.Join(t.TempDir(), "backing.img"), 4<<20)
	o := Options{Logger: quietLogger(), DirectIO: DirectIOOn}
	e := export(t, dev, o)
	live, err := e.Conn()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(live)
	if err := ConnAlive(live); err != nil {
		t.Errorf("a served connection: %v", err)
	}
	never, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(never)
	if err := ConnAlive(never); !errors.Is(err, ErrNoExport) {
		t.Errorf("a /dev/fuse descriptor never mounted: %v, want ErrNoExport", err)
	}
	loop, dir := e.Device(), filepath.Dir(e.File())
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ConnAlive(live); !errors.Is(err, ErrNoExport) {
		t.Errorf("the connection after its export closed: %v, want ErrNoExport", err)
	}
	// Another export at the same place; a descriptor of the old connection is not its.
	again, err := Export(context.Background(), dev, dir, o)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	old, err := unix.Dup(live)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Adopt(context.Background(), dev, dir, again.Device(), old, o); !errors.Is(err, ErrNoExport) {
		t.Errorf("adopting the old connection (loop device %s, now %s): %v, want ErrNoExport", loop, again.Device(), err)
	}
}

// TestAdoptAfterStop: the serving process hangs (SIGSTOP) while the writer syncs record
// after record; the writer waits on a request nobody answers. The process is then killed,
// as the kubelet kills a node plugin whose liveness probe fails (SIGKILL ends a stopped
// process, which never sees a SIGTERM), and a new process adopts the connection this one
// held. What the stopped process had read comes again (NOTIFY_RESEND): no write fails, and
// every record is on the Device.
func TestAdoptAfterStop(t *testing.T) {
	requireMount(t)
	backing := filepath.Join(t.TempDir(), "backing.img")
	dev := newFileDevice(t, backing, 64<<20)
	dir := filepath.Join(t.TempDir(), "export")
	file := filepath.Join(dir, VolumeName)
	abortIfStuck(t, file)
	t.Cleanup(func() {
		if err := Cleanup(dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})

	first, _, loop, conn := startTakeoverHelper(t, backing, dir, "", -1, 0)
	w := startWriter(t, loop, file)
	wantAcked(t, w, 100)
	if err := first.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := w.Acked()
	wait.Eventually(t, time.Minute, "a request of the writer waiting on the stopped server", func(context.Context) (bool, error) {
		n, err := waitingRequests(dir)
		return n > 0, err
	})
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	if err := w.Err(); err != nil {
		t.Fatalf("a write failed while the server was stopped: %v", err)
	}
	next, _, _, _ := startTakeoverHelper(t, backing, dir, loop, conn, 0)
	wantAcked(t, w, stopped+100)
	n := stopWriter(t, w)
	t.Logf("%d records through a stopped and killed server, the longest write+fsync %s", n, w.MaxPause())
	if err := records.Verify(dev.f, n); err != nil {
		t.Fatal(err)
	}
	unix.Close(conn)
	_ = next.Process.Signal(syscall.SIGTERM) // closes its export
	if err := next.Wait(); err != nil {
		t.Errorf("last helper: %v", err)
	}
}

// waitingRequests is how many requests of the FUSE connection mounted at dir wait for an
// answer (fusectl's waiting).
func waitingRequests(dir string) (int, error) {
	ms, err := mountsAt(dir)
	if err != nil || len(ms) == 0 {
		return 0, fmt.Errorf("no mount at %s: %v", dir, err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/sys/fs/fuse/connections/%d/waiting", unix.Minor(ms[len(ms)-1].dev)))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
