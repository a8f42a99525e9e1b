package driver

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/crdipc/crdipc/internal/storage/blockdev"
	"github.com/crdipc/crdipc/internal/storage/fdstore"
)

// A volume's data path outlives the node plugin's process. Each staged volume's FUSE
// connection is kept by the fd holder (Options.FDHolder, crdipc fd-holder), so that when
// this process stops — a rollout, an upgrade, a crash, an OOM kill — the kernel keeps the
// connection, its mount, the loop device and the file system on it; I/O waits. The next
// process takes the connections back before it serves CSI (recoverTargets), starts each
// volume's engine and serves the connection again (blockdev.Adopt), which resends what the
// dead process had read and not answered. A graceful stop first answers what it has read
// and closes its replica sessions cleanly (releaseTargets), so the successor rebuilds
// nothing.

// keepEvery is how often the holder is checked for every staged volume's connection: a
// holder that restarted has lost them all, and gets them again.
const keepEvery = 5 * time.Second

// holderPrefix starts the names of this driver's entries in the holder:
// csi-target/<volume id>/<loop device>, e.g. csi-target/pvc-1/loop3. The loop device is in
// the name because nothing else tells the next process which one is the volume's (see
// blockdev.Exists).
const holderPrefix = "csi-target/"

func holderName(id string, s *staged) string {
	return holderPrefix + id + "/" + filepath.Base(s.export.Device())
}

// parseHolderName is the volume id and loop device (/dev/loopN) of one of our names.
func parseHolderName(name string) (id, loop string, ok bool) {
	rest, ok := strings.CutPrefix(name, holderPrefix)
	if !ok {
		return "", "", false
	}
	id, dev, ok := strings.Cut(rest, "/")
	if !ok || id == "" || !strings.HasPrefix(dev, "loop") || strings.Contains(dev, "/") {
		return "", "", false
	}
	return id, "/dev/" + dev, true
}

func (d *Driver) holder() *fdstore.Client {
	if d.o.FDHolder == "" || d.o.NodeID == "" {
		return nil
	}
	return &fdstore.Client{Path: d.o.FDHolder}
}

// keep gives the holder a descriptor of s's connection. Without it the volume still
// works, but does not outlive this process; keepLoop tries again.
func (d *Driver) keep(id string, s *staged) {
	h := d.holder()
	if h == nil {
		return
	}
	fd, err := s.export.Conn()
	if err == nil {
		err = h.Put(holderName(id, s), fd)
		unix.Close(fd)
	}
	if err != nil {
		d.log.Error(err, "the fd holder does not keep the volume's connection: a restart of this process would fail its I/O; retrying", "volume", id)
	}
}

// forget drops volume id's connections from the holder. A failure leaves a stale entry,
// which keepLoop, or the next process's recoverTargets, drops.
func (d *Driver) forget(id string) {
	h := d.holder()
	if h == nil {
		return
	}
	names, err := h.List()
	for _, n := range names {
		if nid, _, ok := parseHolderName(n); ok && nid == id && err == nil {
			err = h.Delete(n)
		}
	}
	if err != nil {
		d.log.Error(err, "removing the volume's connection from the fd holder", "volume", id)
	}
}

// keepLoop re-gives the holder what it lacks, and drops what it should not hold, until ctx
// ends.
func (d *Driver) keepLoop(ctx context.Context) {
	h := d.holder()
	if h == nil {
		return
	}
	t := time.NewTicker(keepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		names, err := h.List()
		if err != nil {
			d.log.Error(err, "listing the fd holder")
			continue
		}
		held := map[string]bool{}
		for _, n := range names {
			held[n] = true
		}
		d.data.Lock()
		missing := map[string]*staged{}
		for id, s := range d.data.staged {
			if !held[holderName(id, s)] {
				missing[id] = s
			}
		}
		d.data.Unlock()
		for id, s := range missing {
			d.keep(id, s)
		}
		if len(missing) > 0 {
			// A volume unstaged meanwhile (stopTarget) has had its entries forgotten; the
			// one just put would outlive it.
			if names, err = h.List(); err != nil {
				continue
			}
		}
		d.dropStale(names)
	}
}

// dropStale drops the holder's entries (names, as listed) that no volume of this process
// is served by: a second entry of a staged volume, or one of a volume neither staged nor
// in a Node call (a forget that failed). A volume in a Node call or being taken over is
// left alone: its entries are what it is about to serve.
func (d *Driver) dropStale(names []string) {
	for _, n := range names {
		id, _, ok := parseHolderName(n)
		if !ok {
			continue
		}
		// Under the lock of Node calls: none starts on the volume meanwhile (it would
		// wait), and one in flight (a stage that has put its entry and not yet recorded
		// its volume as staged) makes the volume busy.
		d.nodeOps.Lock()
		if !d.nodeOps.busy[id] {
			if s := d.stagedVolume(id); s == nil || holderName(id, s) != n {
				d.log.Info("dropping the fd holder's stale entry", "volume", id, "entry", n)
				d.drop(n)
			}
		}
		d.nodeOps.Unlock()
	}
}

// drop deletes one entry from the holder; keepLoop tries again on failure.
func (d *Driver) drop(name string) {
	if err := d.holder().Delete(name); err != nil {
		d.log.Error(err, "removing an entry from the fd holder; retrying", "entry", name)
	}
}

// recoverTargets takes over the volumes an earlier process of this driver staged, as the
// holder lists them. Each is locked (lockVolume) until it is served again, so a Node call
// for it meanwhile answers Aborted and is retried; none waits for the others. A volume may
// have more than one entry (a forget that failed, an entry put back while the volume was
// unstaged): recoverTarget picks the live one.
func (d *Driver) recoverTargets(ctx context.Context) {
	h := d.holder()
	if h == nil {
		return
	}
	names, err := h.List()
	if err != nil {
		d.log.Error(err, "listing the fd holder: volumes this node staged before this process started are not served again; their I/O waits until they are unstaged or the holder is reachable")
		return
	}
	entries := map[string][]string{} // volume id → its entries
	for _, n := range names {
		if id, _, ok := parseHolderName(n); ok {
			entries[id] = append(entries[id], n)
		}
	}
	for id, names := range entries {
		done, err := d.lockVolume(id)
		if err != nil {
			continue
		}
		d.log.Info("taking over the volume's target from an earlier process", "volume", id, "entries", names)
		go func() {
			defer done()
			d.recoverTarget(ctx, id, names)
		}()
	}
}

// recoverTarget serves volume id's kept connection again, retrying (with backoff, until
// ctx ends) what can recover: the API, the data certificate, a quorum of replicas. Of the
// volume's entries (names), the one to serve holds a live connection of the export at the
// volume's target directory, bound to the loop device its name gives; the others are
// stale, and dropped (keepLoop retries what fails here).
func (d *Driver) recoverTarget(ctx context.Context, id string, names []string) {
	start := time.Now()
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 30 * time.Second}
	for {
		name, loop, conn, stale, err := d.liveEntry(id, names)
		for _, n := range stale {
			d.log.Info("dropping the fd holder's stale entry", "volume", id, "entry", n)
			d.drop(n)
		}
		if err == nil && name == "" {
			// Unstaged, or torn down, while no process served it: nothing to take over.
			d.log.Info("no live connection of the volume in the fd holder: nothing to take over", "volume", id)
			return
		}
		if err == nil {
			err = d.adoptTarget(ctx, id, loop, conn)
			if err == nil {
				d.metrics.takeovers.Inc()
				d.log.Info("volume target taken over from an earlier process", "volume", id, "device", loop, "took", time.Since(start))
				return
			}
			names = []string{name}
		}
		d.log.Error(err, "taking over the volume's target; its I/O waits meanwhile; retrying", "volume", id)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff.Step()):
		}
	}
}

// liveEntry examines volume id's entries: it returns the one to serve (its name, loop
// device and a descriptor of its connection, which the caller owns; "" when none is) and
// those that are stale. An error is one that may pass (the holder or the mount table did
// not answer).
func (d *Driver) liveEntry(id string, names []string) (name, loop string, conn int, stale []string, err error) {
	dir, err := d.adoptDir(id)
	if err != nil {
		return "", "", -1, nil, err
	}
	conn = -1
	var errs []error
	for _, n := range names {
		_, l, _ := parseHolderName(n)
		if err := blockdev.Exists(dir, l); errors.Is(err, blockdev.ErrNoExport) {
			stale = append(stale, n)
			continue
		} else if err != nil {
			errs = append(errs, err)
			continue
		}
		fd, err := d.holder().Get(n)
		if errors.Is(err, fdstore.ErrNotFound) {
			continue // gone meanwhile
		} else if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := blockdev.ConnAlive(fd); err != nil {
			unix.Close(fd)
			if errors.Is(err, blockdev.ErrNoExport) {
				stale = append(stale, n)
			} else {
				errs = append(errs, err)
			}
			continue
		}
		if conn >= 0 {
			// Two live connections for one volume: the mount of an earlier staging kept
			// alive elsewhere. The first is served; the other stays for whoever unstages.
			d.log.Info("more than one live connection of the volume in the fd holder; serving the first", "volume", id, "serving", name, "other", n)
			unix.Close(fd)
			continue
		}
		name, loop, conn = n, l, fd
	}
	if conn < 0 && len(errs) > 0 {
		return "", "", -1, stale, errors.Join(errs...)
	}
	return name, loop, conn, stale, nil
}

// adoptTarget starts volume id's engine and serves conn, its connection, whose loop
// device is loop. It owns conn.
func (d *Driver) adoptTarget(ctx context.Context, id, loop string, conn int) error {
	dir, err := d.adoptDir(id)
	if err != nil {
		unix.Close(conn)
		return err
	}
	// A quorum may take a while after a node came back (replicas rebuilding, a pool agent
	// restarting); the volume's I/O waits either way.
	ectx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	e, tlsConf, err := d.newEngine(ectx, id)
	if err != nil {
		unix.Close(conn)
		return err
	}
	ex, err := blockdev.Adopt(ctx, e, dir, loop, conn, d.exportOptions(id))
	if err != nil {
		e.Close()
		return err
	}
	s := d.follow(id, e, ex, tlsConf)
	d.setStaged(id, s)
	return nil
}

// adoptDir is targetDir for a volume whose FUSE mount no process serves yet: the target
// directory is resolved, but not the volume's own directory, the mount point, since
// anything that stats it waits for a server.
func (d *Driver) adoptDir(id string) (string, error) {
	if err := pathElement(id); err != nil {
		return "", err
	}
	root, err := resolve(filepath.Clean(d.o.TargetDir))
	if err != nil {
		return "", err
	}
	return filepath.Join(root, id), nil
}

// releaseTargets hands every staged volume on to the next process: each export stops
// reading and answers what it read, and each engine closes its replica sessions cleanly.
// The mounts stay, kept by the holder. A volume the holder does not take is left to die
// with the process, as it would have without a holder.
//
// Whether the holder keeps a volume is asked, not remembered: a holder that restarted since
// keepLoop last looked holds nothing, and releasing this process's descriptor, the last
// one, would end the connection (EIO). So the holder is given the connection again before
// the release, and once more after it, while this process still holds a descriptor of its
// own.
func (d *Driver) releaseTargets() {
	h := d.holder()
	if h == nil {
		return
	}
	d.data.Lock()
	staged := d.data.staged
	d.data.staged = nil
	d.data.Unlock()
	for id, s := range staged {
		name := holderName(id, s)
		own, err := s.export.Conn()
		if err == nil {
			if err = h.Put(name, own); err != nil {
				unix.Close(own)
			}
		}
		if err != nil {
			d.log.Error(err, "not releasing the volume: the fd holder does not take its connection; its I/O fails when this process exits", "volume", id)
			continue
		}
		s.stop()
		<-s.done
		if err := s.export.Release(); err != nil {
			d.log.Error(err, "releasing the volume's export", "volume", id)
		}
		if err := s.engine.Close(); err != nil {
			d.log.Error(err, "closing the volume's engine", "volume", id)
		}
		if err := h.Put(name, own); err != nil {
			d.log.Error(err, "giving the fd holder the released volume's connection again; it keeps the one it was given before the release, if it still runs", "volume", id)
		}
		unix.Close(own)
		d.log.Info("volume target released for the next process", "volume", id)
	}
}
