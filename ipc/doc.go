// Package ipc is request/response between services over Kubernetes custom
// resources: the "easy way to implement a CRD watcher" that seed 000 asks for.
//
// # The status contract
//
// A request is a custom resource. Its spec is what the sender wants; its
// status is the receiver's reply, and every crdipc kind shapes it the same way:
//
//   - status.observedGeneration is the metadata.generation the receiver last
//     acted on. While it is behind metadata.generation, the rest of the status
//     describes an older spec and means nothing for the current one.
//   - status.conditions ([]metav1.Condition) holds Ready: True when the
//     request is done; False with a reason while it is not. A reason is either
//     terminal (Failed, InvalidSpec: the receiver gave up on this generation,
//     see conditions.IsTerminal) or not (Pending, Reconciling, Waiting,
//     Degraded: keep waiting). The message is for humans.
//   - Progressing is True while the receiver is still working on the
//     current generation.
//
// # Sender side
//
// Await watches one object (never polls) from the resourceVersion the caller
// holds and returns when the status is current and the condition holds, with
// a *TerminalError when the receiver reports a terminal failure, or with
// ctx.Err(). Call is create (or server-side apply) plus Await. A status
// written for an older generation never satisfies a wait: that is the
// kubectl wait bug (kubernetes/kubectl#962) this package exists to avoid.
//
// ReceiverReady tells a sender, before a time-critical direct call, whether a
// live receiver for a kind holds a fresh Lease.
//
// # Receiver side
//
// A receiver is a Handler for one kind registered with Register on a
// controller-runtime manager. The package does what every receiver repeats:
// the finalizer when the handler implements Finalizer, observedGeneration and
// the Ready/Progressing conditions, an Event on every Ready transition,
// Prometheus metrics, retry with exponential backoff (no retry for terminal
// failures), deletion of finished requests after ttlSecondsAfterFinished, and
// the Lease heartbeat behind ReceiverReady. Leader election is the manager's.
package ipc
