// Package webhook is the GitHub webhook listener of seed 003: it verifies a delivery's
// HMAC-SHA256 signature, turns pull_request, create, delete and push deliveries into
// PullRequest and Branch resources (scm.crdipc.io/v1alpha1), and records one core/v1 Event per
// delivery on the resource it changed.
//
// Three properties make it safe to point GitHub at:
//
//   - Idempotent: object names are derived from the repository and PR number or branch, and
//     the Event is named <object>.<X-GitHub-Delivery>, so a redelivery creates nothing new.
//   - Ordered: an object remembers the time of the delivery that wrote it (updatedAt); an
//     older delivery that arrives late still gets its Event but does not change the object.
//   - Honest answers: 2xx only once the object and the Event are stored; 4xx with a reason for
//     input that can never succeed; 503 when the API server cannot be reached, so GitHub
//     marks the delivery failed and it can be redelivered.
package webhook
