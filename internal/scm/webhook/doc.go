// Package webhook is the GitHub webhook listener of seed 003: it verifies a delivery's
// HMAC-SHA256 signature, turns pull_request, create, delete and push deliveries into
// PullRequest and Branch resources (scm.crdipc.io/v1alpha1), and records one core/v1 Event per
// delivered body on the resource it changed.
//
// These properties make it safe to point GitHub at:
//
//   - Idempotent: object names are derived from the repository and PR number or branch, and
//     the Event is named <object>.sha256-<digest of the body> (its annotation names the
//     X-GitHub-Delivery), so a redelivery creates nothing new, and neither does a copy of the
//     body under another delivery ID.
//   - Durable dedup: Events are the user-visible record, but the API server deletes them after
//     an hour and GitHub redelivers for days, so "seen before" is decided by a Delivery record
//     (record.go), kept for Options.DeliveryRetention (72 h) and then deleted by Start's
//     collector. One record per body, named sha256-<digest of the raw, signed body>: the digest
//     is what an attacker cannot change without the secret, while the headers (delivery ID,
//     event) are unsigned. So the same body under the same event answers 200 duplicate
//     whatever its delivery ID (a redelivery, a replay, or two hooks sending one body), the
//     same body under another event is a header-swapped replay and answers 409, and a recorded
//     delivery ID with another body answers 409. A swapped replay never gets as far as a write
//     even without a record (a body past the retention, or one whose record the cache does not
//     hold yet): under another handled event a GitHub body fails to parse or is ignored, except
//     a create as a delete or the reverse, which its shape refuses (checkShape).
//   - Three writes, crash-safe order: object → Event → record, the record created complete
//     (result, object, Event) in one write, the last. The record never says done before the
//     object and Event are stored; an attempt that ends before it leaves no record, and the
//     next delivery of the body redoes the idempotent writes (the object is unchanged, the
//     Event exists) and writes it. The record is looked up in the listener's cache, not on the
//     API server: a miss (a record younger than the cache's lag) goes on to the idempotent
//     writes, and the record's create, meeting the record, decides the answer. Concurrent
//     copies of a body meet on the Event's name, then on the record's: one Event, one record.
//     A record an earlier listener left pending (it wrote the record first) is completed.
//   - Ordered: an object remembers the time of the delivery that wrote it (updatedAt); an
//     older delivery that arrives late still gets its Event but does not change the object.
//   - Bounded before authentication: LimitListener caps open connections, and at most
//     Options.MaxConcurrentRequests deliveries are read, verified and stored at once; one
//     more is answered 503 with Retry-After before its body is read.
//   - Honest answers: 2xx only once the object, the Event and the record are stored; 4xx
//     with a reason for input that can never succeed; 503 when the API server cannot be
//     reached, so GitHub marks the delivery failed and it can be redelivered.
package webhook
