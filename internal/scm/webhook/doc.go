// Package webhook is the GitHub webhook listener of seed 003: it verifies a delivery's
// HMAC-SHA256 signature, turns pull_request, create, delete and push deliveries into
// PullRequest and Branch resources (scm.crdipc.io/v1alpha1), and records one core/v1 Event per
// delivery on the resource it changed.
//
// These properties make it safe to point GitHub at:
//
//   - Idempotent: object names are derived from the repository and PR number or branch, and
//     the Event is named <object>.<X-GitHub-Delivery>, so a redelivery creates nothing new.
//   - Durable dedup: Events are the user-visible record, but the API server deletes them after
//     an hour and GitHub redelivers for days, so "seen before" is decided by a Delivery record
//     (record.go), kept for Options.DeliveryRetention (72 h) and then deleted by Start's
//     collector. One record per body, named sha256-<digest of the raw, signed body>: the digest
//     is what an attacker cannot change without the secret, while the headers (delivery ID,
//     event) are unsigned. So the same body under the same event answers 200 duplicate
//     whatever its delivery ID (a redelivery, a replay, or two hooks sending one body), the
//     same body under another event is a header-swapped replay and answers 409, and a recorded
//     delivery ID with another body answers 409. A body past the retention has no record; the
//     one swap that would parse (create as delete) is also refused by its shape.
//   - Crash-safe order: record (pending, status empty) → object → Event → record status
//     (result). The record never says done before the object and Event are stored; an attempt
//     that ends in between leaves it pending, and the next delivery of the body redoes the
//     idempotent writes and completes it. The record is created first so that concurrent
//     copies of a body meet on its name.
//   - Ordered: an object remembers the time of the delivery that wrote it (updatedAt); an
//     older delivery that arrives late still gets its Event but does not change the object.
//   - Bounded before authentication: LimitListener caps open connections, and at most
//     Options.MaxConcurrentRequests deliveries are read, verified and stored at once; one
//     more is answered 503 with Retry-After before its body is read.
//   - Honest answers: 2xx only once the object, the Event and the record are stored; 4xx
//     with a reason for input that can never succeed; 503 when the API server cannot be
//     reached, so GitHub marks the delivery failed and it can be redelivered.
package webhook
