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
// Call and Await ride out an API server that goes away and comes back (a
// restart of `crdipc up`, a dropped connection): they retry with backoff,
// capped at a few seconds, until ctx ends. Await then watches again from the
// last version it saw, or, when the restarted server no longer has that
// version (410 Gone, "too old resource version"), from the current one that
// a list of the object returns. The requests that ipc has open at once are
// bounded per process (64), so that thousands of waiting calls do not open
// thousands of connections to a server that is starting.
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
//
// The finalizer is stored before Handle first runs, so that nothing Handle
// does can outlive a request deleted meanwhile. A handler whose effects are
// all owned by the request (owner references, which the garbage collector
// follows) sets Options.OwnedEffects: the finalizer is then stored while
// Handle runs, and a new request's reply waits for one write less. Either
// way the status is written only once the finalizer is stored.
//
// # Tracing
//
// A request is one OpenTelemetry trace from the sender to the receivers that
// act on it. Call is a span ("call <Kind>") and stores its W3C context on the
// request, in TraceParentAnnotation (KEP-5915's carrier); the receiver's
// reconcile is a child of that span ("reconcile <Kind>"), with a span for the
// handler and one for the status write. A handler passes the request's trace
// on to the objects it creates with InjectTraceContext, and a controller that
// is not an ipc receiver continues a trace with StartSpan. Receivers never
// change the annotation, so a reconcile repeated for the same generation
// continues the same trace. Spans go to the global tracer provider unless
// WithTracerProvider or Options.TracerProvider name another; with none set,
// tracing costs nothing but carrying a context along. For the API server's
// spans to join, the client's transport must send the traceparent header
// (otelhttp).
//
// # Exactly once
//
// What happens once per request, and what may happen more than once, across
// crashes, lost responses and API server restarts:
//
//   - One request object per Call. A create whose response is lost is
//     retried; the retry recognises the object the lost attempt stored by
//     its CallIDAnnotation and waits for it instead of failing with
//     AlreadyExists or sending a second request. A name left to
//     metadata.generateName is drawn by Call before the first attempt, so a
//     retry cannot create a second object under a new name.
//   - One return per Call and Await, with the reply to the request's current
//     generation: the first status that is current and satisfies the
//     condition (or is a terminal failure).
//   - At least once per generation for the handler. The receiver calls it
//     again when it cannot know that its reply was stored: after a crash, a
//     failed or lost status write, a conflict with a newer copy of the
//     object. A handler's side effects must therefore be idempotent (check
//     before acting, create under deterministic names); that makes each
//     effect happen once, and the reply it leads to is the same each time.
//   - One Event per Ready transition (per generation, status, reason and
//     message), written after the status that shows it: an Event never
//     reports a transition that was not stored, and a sender's Call returns
//     without waiting for it. Until it is written the Event is owed, in the
//     receiver's memory: a reconcile repeated because the status write failed
//     or its response was lost finds the transition already stored and writes
//     the owed Event then. Its name is derived from what it reports, so
//     writing it twice stores it once. An Event is lost only if the receiver
//     process dies between the status write and the Event write (a receiver
//     being stopped still writes it, for up to five seconds); the status
//     remains the record. An Event the API server refuses for good (no
//     permission) is logged and dropped, never retried.
//   - The metrics (requests by result, age at completion) count verdicts this
//     process stored; they are per process and can miss a verdict whose
//     status write succeeded but whose response was lost.
package ipc
