package identity

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// KeeperUser is the user the Keeper of `crdipc up` requests tokens as (a client
// certificate's), granted by GrantKeeper what that needs: up's admin credentials stay with
// its bootstrap.
const KeeperUser = "crdipc:token-keeper"

// keeperRole names the roles and bindings GrantKeeper writes.
const keeperRole = "crdipc-token-keeper"

// GrantKeeper lets user request tokens of exactly the ServiceAccounts of the given services
// (namespaces, by service, as Apply returns them) and get Nodes, which a token bound to a
// Node names, and waits until the authorizer enforces it. Minting those tokens is acting as
// any of those accounts, and nothing more: no other account's token, no Secret, no RBAC.
func GrantKeeper(ctx context.Context, cfg *rest.Config, user string, namespaces map[string]string) error {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("identities: %w", err)
	}
	byNamespace := map[string][]any{}
	for svc, ns := range namespaces {
		byNamespace[ns] = append(byNamespace[ns], ServiceAccount(svc))
	}
	subjects := []any{map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}}
	object := func(kind, namespace string, fields map[string]any) *unstructured.Unstructured {
		meta := map[string]any{"name": keeperRole}
		if namespace != "" {
			meta["namespace"] = namespace
		}
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta}}
		for k, v := range fields {
			u.Object[k] = v
		}
		return u
	}
	// One group per namespace: waitEnforced knows a role by kind and name, and each
	// namespace's Role has the same name.
	groups := [][]*unstructured.Unstructured{{
		object("ClusterRole", "", map[string]any{"rules": []any{
			map[string]any{"apiGroups": []any{""}, "resources": []any{"nodes"}, "verbs": []any{"get"}},
		}}),
		object("ClusterRoleBinding", "", map[string]any{
			"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": keeperRole},
			"subjects": subjects,
		}),
	}}
	for ns, accounts := range byNamespace {
		slices.SortFunc(accounts, func(a, b any) int { return strings.Compare(a.(string), b.(string)) })
		groups = append(groups, []*unstructured.Unstructured{
			object("Role", ns, map[string]any{"rules": []any{
				map[string]any{"apiGroups": []any{""}, "resources": []any{"serviceaccounts/token"}, "verbs": []any{"create"}, "resourceNames": accounts},
			}}),
			object("RoleBinding", ns, map[string]any{
				"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": keeperRole},
				"subjects": subjects,
			}),
		})
	}
	for _, objs := range groups {
		for _, u := range objs {
			if err := applyObject(ctx, kube, "token keeper", u); err != nil {
				return err
			}
		}
	}
	for _, objs := range groups {
		if err := waitEnforced(ctx, kube, user, objs); err != nil {
			return fmt.Errorf("identities: token keeper: %w", err)
		}
	}
	return nil
}
