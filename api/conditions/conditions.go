// Package conditions is the status contract shared by every crdipc kind: the condition types and
// reasons a receiver writes and a sender waits on. Senders and receivers import this instead of
// each other, so the strings cannot drift apart.
package conditions

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Condition types.
const (
	// TypeReady is True when the request is done. False carries a reason saying whether the
	// receiver is still working (non-terminal) or has given up (terminal, see IsTerminal).
	TypeReady = "Ready"
	// TypeProgressing is True while a receiver is acting on the current generation.
	TypeProgressing = "Progressing"
)

// Reasons. A sender decides whether to keep waiting from the reason alone, so every reason is
// either terminal or not; the human detail goes into the condition message.
const (
	// ReasonSucceeded: Ready=True, the request is done.
	ReasonSucceeded = "Succeeded"
	// ReasonPending: the request is stored but no receiver has acted on it yet.
	ReasonPending = "Pending"
	// ReasonReconciling: a receiver is working on the request.
	ReasonReconciling = "Reconciling"
	// ReasonWaiting: the receiver cannot finish until the cluster changes (for example fewer
	// pools than replicas); it will continue on its own, no user action is needed.
	ReasonWaiting = "Waiting"
	// ReasonDegraded: the request is served but below its desired level (some replicas missing).
	ReasonDegraded = "Degraded"
	// ReasonDeleting: the object is being deleted and its finalizer is releasing resources.
	ReasonDeleting = "Deleting"
	// ReasonFailed: terminal; the receiver tried and will not retry this generation.
	ReasonFailed = "Failed"
	// ReasonInvalidSpec: terminal; the spec passed schema validation but cannot be served
	// (for example an ISBN whose checksum is wrong). A new generation may fix it.
	ReasonInvalidSpec = "InvalidSpec"
)

// IsTerminal reports whether a Ready=False reason means the receiver has given up on the
// current generation, so a sender should stop waiting and report the failure.
func IsTerminal(reason string) bool {
	return reason == ReasonFailed || reason == ReasonInvalidSpec
}

// Object is implemented by every crdipc kind, so generic code (the ipc package, tests) can read
// and write the status contract without knowing the concrete type.
type Object interface {
	metav1.Object
	runtime.Object
	GetConditions() []metav1.Condition
	SetConditions([]metav1.Condition)
	GetObservedGeneration() int64
	SetObservedGeneration(int64)
}
