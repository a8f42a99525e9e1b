package target

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crdipc/crdipc/internal/storage/replica"
)

// SectorSize is the unit replicas track freshness in during a rebuild; writes that are not
// whole sectors are widened by read-modify-write.
const SectorSize = replica.SectorSize

// maxIO bounds one request to a replica, well under the replica protocol's frame limit.
const maxIO = 1 << 20

const (
	defaultIOTimeout      = 10 * time.Second
	defaultRejoinInterval = 2 * time.Second
	// maxRebuildPoll bounds how long a replica whose rebuild finished waits to count as
	// healthy: a rolling restart of the pool agents takes the next replica down as soon as
	// this one's agent says it caught up, and until the engine has seen it, that is a
	// replica short of quorum.
	maxRebuildPoll = 200 * time.Millisecond
	busyRetry      = 50 * time.Millisecond
)

var (
	// ErrNoQuorum: fewer than ConsistencyFactor healthy replicas took a write or flush (or
	// were reachable at start). Nothing was acknowledged.
	ErrNoQuorum = errors.New("no quorum of healthy replicas")
	// ErrUnavailable: no healthy replica could serve a read.
	ErrUnavailable = errors.New("no healthy replica")
	// ErrClosed: the engine was closed.
	ErrClosed = errors.New("volume engine closed")

	errNotJoined = errors.New("not joined yet")
	errRemoved   = errors.New("removed")
)

// State is a replica's role in the engine.
type State string

const (
	// Healthy replicas hold every acknowledged write: they count toward acks and serve reads.
	Healthy State = "Healthy"
	// Rebuilding replicas receive every write but are still copying the rest from a healthy
	// one: they neither count toward acks nor serve reads.
	Rebuilding State = "Rebuilding"
	// Faulted replicas are outside the write set; the engine retries them every RejoinInterval.
	Faulted State = "Faulted"
)

// Status is what States reports for one replica.
type Status struct {
	State State
	// Err is why the replica is faulted (or why its last rebuild attempt failed).
	Err      error
	Local    bool
	Revision uint64 // as last reported by the replica
	// RebuildDone and RebuildTotal are the replica's rebuild progress in bytes.
	RebuildDone, RebuildTotal int64
}

// Options configure an Engine.
type Options struct {
	Members []Member
	// ConsistencyFactor is how many healthy replicas must take a write before it is
	// acknowledged. Use a majority of Members so that any ConsistencyFactor replicas at
	// start include one holding every acknowledged write.
	ConsistencyFactor int
	// Size of the volume in bytes (a multiple of SectorSize); 0 takes the source replica's.
	Size int64
	// OnReplicaState is called (outside the engine's locks) when a replica changes state.
	OnReplicaState func(id string, s State, err error)
	// IOTimeout bounds every call to a replica (default 10s); a replica that does not
	// answer a write in time is faulted.
	IOTimeout time.Duration
	// RejoinInterval is how often faulted replicas are retried (default 2s); rebuilding ones
	// are polled every 200ms, or every RejoinInterval if that is shorter.
	RejoinInterval time.Duration
	// QuorumWait is how long a write waits for rebuilding replicas to become healthy when
	// fewer than ConsistencyFactor are (for instance just after an unclean restart); 0 fails
	// such writes at once with ErrNoQuorum.
	QuorumWait time.Duration
	Logger     *slog.Logger
}

type member struct {
	Member
	r           Replica
	gen         uint64 // bumped on every (re)admission so late results of an old one are ignored
	state       State
	err         error
	info        Info
	busy        bool      // a rejoin or rebuild poll is running
	retryAt     time.Time // a faulted replica's next rejoin is not tried before this
	removed     bool      // RemoveMember took it out
	rebuildBase uint64    // acknowledged revision when the rebuild began
}

// Engine is the volume engine of one staged volume: it writes every replica of the write set,
// acknowledges at ConsistencyFactor healthy ones, reads from a healthy one and rebuilds the
// others while I/O goes on. It implements blockdev.Device.
type Engine struct {
	cf int
	// size is the volume size; it only grows (Grow), and I/O checks ranges against it.
	size           atomic.Int64
	growMu         sync.Mutex // serializes Grow, and Grow with Snapshot
	snapMu         sync.Mutex // serializes Snapshot and DeleteSnapshot
	ioTimeout      time.Duration
	rejoinInterval time.Duration
	pollInterval   time.Duration // of rebuilding replicas, and of the loop
	quorumWait     time.Duration
	log            *slog.Logger
	onState        func(id string, s State, err error)

	ioCtx  context.Context // never cancelled: I/O is bounded by ioTimeout, not by Close
	ctx    context.Context // background work; cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   chan struct{}

	locks rangeLock
	// barrier: every write fan-out holds it shared; starting a rebuild holds it exclusively,
	// so no write is half applied (on the rebuilding replica but not yet on the source) when
	// the replica starts tracking which sectors it got from writes.
	barrier sync.RWMutex

	mu       sync.Mutex
	rev      uint64 // last revision handed out; above every revision any replica reported
	ackedRev uint64 // highest revision known to be on ≥ cf healthy replicas
	members  map[string]*member
	order    []*member
	changed  chan struct{} // closed and replaced on every state change
	closed   bool
	next     int // round robin among non-local healthy replicas for reads
}

// New starts the engine: it asks every member for its Info, needs ConsistencyFactor
// reachable non-rebuilding replicas, picks the freshest as source, opens a writer session
// everywhere, and starts rebuilding every replica that is not known identical to the source.
// ctx bounds only the start; the engine runs until Close.
func New(ctx context.Context, o Options) (*Engine, error) {
	if err := validate(o); err != nil {
		return nil, err
	}
	e := &Engine{
		cf:             o.ConsistencyFactor,
		ioTimeout:      o.IOTimeout,
		rejoinInterval: o.RejoinInterval,
		quorumWait:     o.QuorumWait,
		log:            o.Logger,
		onState:        o.OnReplicaState,
		kick:           make(chan struct{}, 1),
		members:        map[string]*member{},
		changed:        make(chan struct{}),
	}
	if e.ioTimeout <= 0 {
		e.ioTimeout = defaultIOTimeout
	}
	if e.rejoinInterval <= 0 {
		e.rejoinInterval = defaultRejoinInterval
	}
	e.pollInterval = min(e.rejoinInterval, maxRebuildPoll)
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	e.size.Store(o.Size)
	e.ioCtx = context.WithoutCancel(ctx)
	e.ctx, e.cancel = context.WithCancel(e.ioCtx)
	for _, m := range o.Members {
		mm := &member{Member: m, r: m.Replica, state: Faulted, err: errNotJoined}
		e.members[m.ID] = mm
		e.order = append(e.order, mm)
	}
	if err := e.start(ctx); err != nil {
		e.cancel()
		for _, m := range e.order {
			e.closeHandle(m, m.r)
		}
		return nil, err
	}
	e.wg.Add(1)
	go e.loop()
	return e, nil
}

func validate(o Options) error {
	if len(o.Members) == 0 {
		return errors.New("no replicas")
	}
	if o.ConsistencyFactor < 1 || o.ConsistencyFactor > len(o.Members) {
		return fmt.Errorf("consistency factor %d out of range 1..%d", o.ConsistencyFactor, len(o.Members))
	}
	if o.Size < 0 || o.Size%SectorSize != 0 {
		return fmt.Errorf("size %d is not a multiple of %d", o.Size, SectorSize)
	}
	seen := map[string]bool{}
	for _, m := range o.Members {
		if err := validMember(m); err != nil {
			return err
		}
		if seen[m.ID] {
			return fmt.Errorf("replica %s listed twice", m.ID)
		}
		seen[m.ID] = true
	}
	return nil
}

func validMember(m Member) error {
	if m.ID == "" {
		return errors.New("replica without id")
	}
	if m.Replica == nil && m.Dial == nil {
		return fmt.Errorf("replica %s: neither Replica nor Dial set", m.ID)
	}
	return nil
}

type probe struct {
	m    *member
	r    Replica
	info Info
	err  error
}

func (e *Engine) start(ctx context.Context) error {
	probes := make([]probe, len(e.order))
	var wg sync.WaitGroup
	for i, m := range e.order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := probe{m: m, r: m.r}
			if p.r == nil {
				p.r, p.err = e.dial(ctx, m)
			}
			if p.err == nil {
				p.info, p.err = e.infoOf(ctx, p.r)
			}
			probes[i] = p
		}()
	}
	wg.Wait()

	size := e.size.Load() // 0: the source's
	var cands []Info
	var candProbes []*probe
	all := map[string]Info{} // every member's, if every one answered
	for i := range probes {
		p := &probes[i]
		p.m.r = p.r
		if p.err != nil {
			p.m.err = p.err
			e.log.Warn("replica unreachable at start", "replica", p.m.ID, "err", p.err)
			all = nil
			continue
		}
		if all != nil {
			all[p.m.ID] = p.info
		}
		p.m.info = p.info
		if p.info.Revision > e.rev {
			e.rev = p.info.Revision
		}
		if !p.info.Rebuilding && (size == 0 || p.info.Size >= size) {
			cands = append(cands, p.info)
			candProbes = append(candProbes, p)
		}
	}
	i, ok := replica.ChooseSource(cands)
	if len(cands) < e.cf && !(ok && soleSource(all, candProbes[i].m.ID)) {
		return fmt.Errorf("%w: %d of %d replicas reachable and complete, %d needed", ErrNoQuorum, len(cands), len(e.order), e.cf)
	}
	if !ok {
		return fmt.Errorf("%w: no replica can be a source", ErrNoQuorum)
	}
	src, srcProbe := cands[i], candProbes[i]
	if size == 0 {
		size = src.Size
	}
	if size <= 0 || size%SectorSize != 0 {
		return fmt.Errorf("source replica %s: size %d is not a positive multiple of %d", src.ID, size, SectorSize)
	}
	e.size.Store(size)
	e.ackedRev = src.Revision
	e.log.Info("source replica chosen", "replica", srcProbe.m.ID, "revision", src.Revision, "dirty", src.Dirty)

	// Equal to the source only if both were closed cleanly at the same revision: a dirty
	// replica may hold writes that no other replica has (or miss some below its revision).
	sameAsSource := func(info Info) bool {
		return !src.Dirty && !info.Dirty && !info.Rebuilding && info.Revision == src.Revision
	}

	// Open every reachable replica (after Info, since Open makes it dirty).
	for i := range probes {
		p := &probes[i]
		if p.err != nil {
			continue
		}
		if p.info.Size < size {
			p.err = smallerErr(p.info.Size, size)
			p.m.err = p.err
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.open(ctx, p.r); err != nil {
				p.err = err
				p.m.err = err
			}
		}()
	}
	wg.Wait()

	var source *member
	for i := range probes {
		p := &probes[i]
		if p.err != nil || (p != srcProbe && !sameAsSource(p.info)) {
			continue
		}
		p.m.state, p.m.err = Healthy, nil
		if source == nil || p == srcProbe {
			source = p.m
		}
	}
	if source == nil {
		return fmt.Errorf("%w: source replica %s: %w", ErrNoQuorum, srcProbe.m.ID, srcProbe.err)
	}
	for i := range probes {
		p := &probes[i]
		switch {
		case p.err != nil:
			if p.m.Dial != nil {
				e.closeHandle(p.m, p.r)
				p.m.r = nil
			}
			e.notify(p.m.ID, Faulted, p.err)
		case p.m.state == Healthy:
			e.notify(p.m.ID, Healthy, nil)
		default:
			// Reports Rebuilding, or Faulted if the replica refuses.
			e.startRebuild(p.m, p.r, source)
		}
	}
	return nil
}

// soleSource reports whether replica src holds every acknowledged write although fewer than
// ConsistencyFactor complete replicas are reachable: all, the Info of every member (nil if
// one did not answer), shows every other member rebuilding, from src or from a member that
// is itself rebuilding, through a chain of rebuild sources that ends at src. Each rebuild
// began from a replica that was healthy then (so not rebuilding) and held every
// acknowledged write; when the last of these rebuilds began, every other member was already
// rebuilding, so its source was src; from then on no other replica was complete, so none but
// src could count toward an ack: src held everything then, and nothing was acknowledged after
// (CF ≥ 2; CF 1 needs no exception). Without this a crash while every other replica rebuilt,
// followed by restarts that stop their copiers, would leave the volume without a source
// forever; so would a crash after a replica rejoined from src while another still rebuilt
// from the first one (r2 from r0, then r0 from r1).
func soleSource(all map[string]Info, src string) bool {
	if _, ok := all[src]; !ok {
		return false
	}
	for id := range all {
		for steps := 0; id != src; steps++ {
			in := all[id]
			if !in.Rebuilding || steps == len(all) {
				return false // complete, or a cycle
			}
			_, from, _ := strings.Cut(in.RebuildSource, "/")
			if _, ok := all[from]; !ok {
				return false // not a member (a snapshot, say)
			}
			id = from
		}
	}
	return true
}

func (e *Engine) dial(ctx context.Context, m *member) (Replica, error) {
	if m.Dial == nil {
		return nil, errors.New("no handle and no Dial")
	}
	ctx, cancel := context.WithTimeout(ctx, e.ioTimeout)
	defer cancel()
	r, err := m.Dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	return r, nil
}

func (e *Engine) infoOf(ctx context.Context, r Replica) (Info, error) {
	ctx, cancel := context.WithTimeout(ctx, e.ioTimeout)
	defer cancel()
	info, err := r.Info(ctx)
	if err != nil {
		return Info{}, fmt.Errorf("info: %w", err)
	}
	return info, nil
}

func (e *Engine) open(ctx context.Context, r Replica) error {
	ctx, cancel := context.WithTimeout(ctx, e.ioTimeout)
	defer cancel()
	for {
		_, err := r.Open(ctx)
		if err == nil {
			return nil
		}
		// Busy is usually the previous target's connection, not yet torn down by the
		// server after that target died: worth waiting for within the timeout.
		if !errors.Is(err, replica.ErrBusy) {
			return fmt.Errorf("open writer session: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("open writer session: %w", err)
		case <-time.After(busyRetry):
		}
	}
}

// closeHandle closes a handle the engine dialed; handles given by the caller stay open.
func (e *Engine) closeHandle(m *member, r Replica) {
	if m.Dial == nil || r == nil {
		return
	}
	if c, ok := r.(io.Closer); ok {
		_ = c.Close()
	}
}

// Size is the volume size in bytes.
func (e *Engine) Size() int64 { return e.size.Load() }

// States reports every replica's state.
func (e *Engine) States() map[string]Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.snapshotStatesLocked()
}

func (e *Engine) snapshotStatesLocked() map[string]Status {
	out := make(map[string]Status, len(e.order))
	for _, m := range e.order {
		out[m.ID] = Status{
			State:        m.state,
			Err:          m.err,
			Local:        m.Local,
			Revision:     m.info.Revision,
			RebuildDone:  m.info.RebuildDone,
			RebuildTotal: m.info.RebuildTotal,
		}
	}
	return out
}

// counts returns how many replicas are healthy and rebuilding.
func (e *Engine) countsLocked() (healthy, rebuilding int) {
	for _, m := range e.order {
		switch m.state {
		case Healthy:
			healthy++
		case Rebuilding:
			rebuilding++
		}
	}
	return
}

// WaitQuorum waits until at least ConsistencyFactor replicas are healthy, so writes can be
// acknowledged (for instance before exposing the volume after an unclean restart).
func (e *Engine) WaitQuorum(ctx context.Context) error {
	for {
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			return ErrClosed
		}
		h, _ := e.countsLocked()
		ch := e.changed
		e.mu.Unlock()
		if h >= e.cf {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%w: %d healthy, %d needed: %w", ErrNoQuorum, h, e.cf, ctx.Err())
		}
	}
}

func (e *Engine) changedLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
}

func (e *Engine) notify(id string, s State, err error) {
	e.log.Info("replica state", "replica", id, "state", s, "err", err)
	if e.onState != nil {
		e.onState(id, s, err)
	}
}

// fault takes a replica out of the write set unless it was already (re)admitted again since
// gen. It reports whether the replica was healthy.
func (e *Engine) fault(m *member, gen uint64, err error) (wasHealthy bool) {
	e.mu.Lock()
	if m.gen != gen || m.state == Faulted || m.removed {
		e.mu.Unlock()
		return false
	}
	wasHealthy = m.state == Healthy
	m.state, m.err = Faulted, err
	old := m.r
	if m.Dial != nil {
		// Drop the connection: its session ends, and late requests on it cannot land on a
		// replica that rejoined through a new one.
		m.r = nil
	}
	e.changedLocked()
	e.mu.Unlock()
	e.closeHandle(m, old)
	e.log.Warn("replica faulted", "replica", m.ID, "err", err)
	e.notify(m.ID, Faulted, err)
	return wasHealthy
}

// AddMember adds a replica placed while the engine runs; it joins by rebuilding.
func (e *Engine) AddMember(m Member) error {
	if err := validMember(m); err != nil {
		return err
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	if _, ok := e.members[m.ID]; ok {
		e.mu.Unlock()
		return fmt.Errorf("replica %s is already a member", m.ID)
	}
	mm := &member{Member: m, r: m.Replica, state: Faulted, err: errNotJoined}
	e.members[m.ID] = mm
	e.order = append(e.order, mm)
	e.changedLocked()
	e.mu.Unlock()
	e.poke()
	return nil
}

// RemoveMember takes a replica out of the volume: it gets no more I/O, its session is closed.
func (e *Engine) RemoveMember(id string) error {
	e.mu.Lock()
	m, ok := e.members[id]
	if !ok {
		e.mu.Unlock()
		return fmt.Errorf("replica %s is not a member", id)
	}
	delete(e.members, id)
	for i, x := range e.order {
		if x == m {
			e.order = append(e.order[:i:i], e.order[i+1:]...)
			break
		}
	}
	inSession := m.state != Faulted
	m.removed, m.state, m.err = true, Faulted, errRemoved
	m.gen++
	r := m.r
	e.changedLocked()
	e.mu.Unlock()
	var err error
	if inSession && r != nil {
		ctx, cancel := context.WithTimeout(e.ioCtx, e.ioTimeout)
		err = r.CloseSession(ctx)
		cancel()
		if err != nil {
			err = fmt.Errorf("replica %s: close session: %w", id, err)
		}
	}
	e.closeHandle(m, r)
	return err
}

func (e *Engine) poke() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// Close waits for writes in flight, stops background work and closes every writer session,
// which clears the replicas' Dirty flag. A replica that was faulted stays dirty.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.changedLocked()
	e.mu.Unlock()

	// Writes that got their revision before closed was set finish first.
	e.barrier.Lock()
	e.barrier.Unlock() //nolint:staticcheck // only waiting for the holders
	e.cancel()
	e.wg.Wait()

	type closing struct {
		m         *member
		r         Replica
		inSession bool
	}
	e.mu.Lock()
	var cs []closing
	for _, m := range e.order {
		cs = append(cs, closing{m, m.r, m.state != Faulted && m.r != nil})
	}
	e.mu.Unlock()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		if !c.inSession {
			e.closeHandle(c.m, c.r)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(e.ioCtx, e.ioTimeout)
			defer cancel()
			if err := c.r.CloseSession(ctx); err != nil {
				errs[i] = fmt.Errorf("replica %s: close session: %w", c.m.ID, err)
			}
			e.closeHandle(c.m, c.r)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
