package operator

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
)

// abandoned reports whether nobody is left to clean up node's pools and replicas: the Node
// object is gone and no agent holds the node's Lease. Their agent finalizer would then keep
// them forever, so the operator releases it; whatever data was on the node stays there.
func abandoned(ctx context.Context, c client.Client, live client.Reader, node string) (bool, error) {
	err := c.Get(ctx, client.ObjectKey{Name: node}, &corev1.Node{})
	if err == nil || !apierrors.IsNotFound(err) {
		return false, err
	}
	var lease coordinationv1.Lease
	err = live.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: storagev1alpha1.NodeLeaseName(node)}, &lease)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	s := lease.Spec
	if s.HolderIdentity == nil || *s.HolderIdentity == "" || s.RenewTime == nil || s.LeaseDurationSeconds == nil {
		return true, nil
	}
	return time.Now().After(s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds) * time.Second)), nil
}

// releaseAbandoned removes the agent's finalizer from obj, which is being deleted, if its
// node is abandoned, and reports whether it did.
func releaseAbandoned(ctx context.Context, c client.Client, live client.Reader, obj client.Object, node string) (bool, error) {
	if obj.GetDeletionTimestamp().IsZero() || !controllerutil.ContainsFinalizer(obj, storagev1alpha1.AgentFinalizer) {
		return false, nil
	}
	gone, err := abandoned(ctx, c, live, node)
	if err != nil || !gone {
		return false, err
	}
	base := obj.DeepCopyObject().(client.Object)
	controllerutil.RemoveFinalizer(obj, storagev1alpha1.AgentFinalizer)
	if err := c.Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("releasing %s of deleted node %s: %w", obj.GetName(), node, err)
	}
	return true, nil
}
