package replica

import (
	"encoding/binary"
	"math/bits"
	"sync"
)

// MaxPayload bounds the data of one frame. Client.ReadAt and Client.WriteAt split larger
// buffers into several pipelined requests.
const MaxPayload = 4 << 20

// maxIDLen bounds the replica id carried in each request.
const maxIDLen = 1024

// SectorSize is the unit of fresh-write tracking during a rebuild, and the alignment
// WriteAt requires.
const SectorSize = 512

// Operations. Never renumber: they are the protocol.
const (
	opPing         uint8 = 1
	opInfo         uint8 = 2
	opOpen         uint8 = 3
	opWrite        uint8 = 4
	opRead         uint8 = 5
	opFlush        uint8 = 6
	opCloseSession uint8 = 7
	opExtents      uint8 = 8
	opRebuild      uint8 = 9
	// Snapshots: the payload is the snapshot's name.
	opSnapshot       uint8 = 10
	opDeleteSnapshot uint8 = 11
	// opFile asks, as the only request of a local-socket connection, for a read-only
	// descriptor of the replica's data file (OpenLocalFile).
	opFile uint8 = 12
)

// Request frame: u32 length of what follows, then reqHeaderLen bytes
//
//	u64 id | u8 op | u8 flags(0) | u16 len(replica) | i64 offset | u64 arg
//
// then the replica id and the payload. arg is the revision of a write and the length of a
// read or extents query.
const reqHeaderLen = 8 + 1 + 1 + 2 + 8 + 8

// Response frame: u32 length of what follows, then respHeaderLen bytes
//
//	u64 id | u8 status | 3 bytes zero | u64 arg
//
// then the payload: data for a read, JSON for Info/Open, (offset,length) u64 pairs for
// Extents (arg=1: more extents follow, ask again from the end of the last one), or the
// error message when status is not OK.
const respHeaderLen = 8 + 1 + 3 + 8

type reqHeader struct {
	id     uint64
	op     uint8
	idLen  uint16
	offset int64
	arg    uint64
}

func (h *reqHeader) encode(b []byte, total int) {
	binary.BigEndian.PutUint32(b[0:], uint32(total))
	binary.BigEndian.PutUint64(b[4:], h.id)
	b[12] = h.op
	b[13] = 0
	binary.BigEndian.PutUint16(b[14:], h.idLen)
	binary.BigEndian.PutUint64(b[16:], uint64(h.offset))
	binary.BigEndian.PutUint64(b[24:], h.arg)
}

func (h *reqHeader) decode(b []byte) {
	h.id = binary.BigEndian.Uint64(b[0:])
	h.op = b[8]
	h.idLen = binary.BigEndian.Uint16(b[10:])
	h.offset = int64(binary.BigEndian.Uint64(b[12:]))
	h.arg = binary.BigEndian.Uint64(b[20:])
}

type respHeader struct {
	id     uint64
	status uint8
	arg    uint64
}

func (h *respHeader) encode(b []byte, total int) {
	binary.BigEndian.PutUint32(b[0:], uint32(total))
	binary.BigEndian.PutUint64(b[4:], h.id)
	b[12] = h.status
	b[13], b[14], b[15] = 0, 0, 0
	binary.BigEndian.PutUint64(b[16:], h.arg)
}

func (h *respHeader) decode(b []byte) {
	h.id = binary.BigEndian.Uint64(b[0:])
	h.status = b[8]
	h.arg = binary.BigEndian.Uint64(b[12:])
}

// Buffers for payloads come from size-classed pools (4 KiB .. MaxPayload, powers of two) so
// that a stream of 1 MiB writes does not allocate 1 MiB per request.
const (
	minClassShift = 12
	numClasses    = 23 - minClassShift // 4 KiB .. 4 MiB
)

var bufPools [numClasses]sync.Pool

func classOf(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassShift
}

// getBuf returns a buffer of length n; n must be ≤ MaxPayload.
func getBuf(n int) *[]byte {
	c := classOf(n)
	if v := bufPools[c].Get(); v != nil {
		b := v.(*[]byte)
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<(c+minClassShift))
	return &b
}

func putBuf(b *[]byte) {
	if b == nil {
		return
	}
	c := classOf(cap(*b))
	if cap(*b) != 1<<(c+minClassShift) {
		return
	}
	bufPools[c].Put(b)
}
