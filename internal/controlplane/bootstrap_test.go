package controlplane_test

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-helpers/auth/rbac/reconciliation"
	schedulingv1 "k8s.io/kubernetes/pkg/apis/scheduling/v1"
	"k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac/bootstrappolicy"

	"github.com/crdipc/crdipc/internal/testenv"
)

// Once the API server is ready, the default RBAC policy and the system PriorityClasses are
// in place, written by crdipc's bootstrap hooks in place of the API server's own: nothing
// of the policy is missing (a dry reconcile finds nothing to do), and /readyz waits for
// crdipc's hooks, not for the disabled ones.
func TestBootstrapPolicy(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	rbac := kube.RbacV1()
	check := func(kind, name string, r *reconciliation.ReconcileClusterRoleResult, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s %s: %v", kind, name, err)
		} else if r.Operation != reconciliation.ReconcileNone {
			t.Errorf("%s %s: %s needed (missing rules %v)", kind, name, r.Operation, r.MissingRules)
		}
	}
	n := 0
	for _, r := range append(bootstrappolicy.ClusterRoles(), bootstrappolicy.ControllerRoles()...) {
		res, err := (&reconciliation.ReconcileRoleOptions{Role: reconciliation.ClusterRoleRuleOwner{ClusterRole: &r}, Client: reconciliation.ClusterRoleModifier{Client: rbac.ClusterRoles()}}).Run()
		check("clusterrole", r.Name, res, err)
		n++
	}
	for ns, roles := range bootstrappolicy.NamespaceRoles() {
		for _, r := range roles {
			res, err := (&reconciliation.ReconcileRoleOptions{Role: reconciliation.RoleRuleOwner{Role: &r}, Client: reconciliation.RoleModifier{Client: rbac, NamespaceClient: kube.CoreV1().Namespaces()}}).Run()
			check("role", ns+"/"+r.Name, res, err)
			n++
		}
	}
	bound := func(kind, name string, r *reconciliation.ReconcileClusterRoleBindingResult, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s %s: %v", kind, name, err)
		} else if r.Operation != reconciliation.ReconcileNone {
			t.Errorf("%s %s: %s needed (missing subjects %v)", kind, name, r.Operation, r.MissingSubjects)
		}
	}
	for _, b := range append(bootstrappolicy.ClusterRoleBindings(), bootstrappolicy.ControllerRoleBindings()...) {
		res, err := (&reconciliation.ReconcileRoleBindingOptions{RoleBinding: reconciliation.ClusterRoleBindingAdapter{ClusterRoleBinding: &b}, Client: reconciliation.ClusterRoleBindingClientAdapter{Client: rbac.ClusterRoleBindings()}}).Run()
		bound("clusterrolebinding", b.Name, res, err)
		n++
	}
	for ns, bindings := range bootstrappolicy.NamespaceRoleBindings() {
		for _, b := range bindings {
			res, err := (&reconciliation.ReconcileRoleBindingOptions{RoleBinding: reconciliation.RoleBindingAdapter{RoleBinding: &b}, Client: reconciliation.RoleBindingClientAdapter{Client: rbac, NamespaceClient: kube.CoreV1().Namespaces()}}).Run()
			bound("rolebinding", ns+"/"+b.Name, res, err)
			n++
		}
	}
	t.Logf("%d roles and bindings in place", n)
	for _, pc := range schedulingv1.SystemPriorityClasses() {
		got, err := kube.SchedulingV1().PriorityClasses().Get(ctx, pc.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && got.Value != pc.Value {
			t.Errorf("PriorityClass %s: %v, value %v; want value %d", pc.Name, err, got, pc.Value)
		} else if err != nil {
			t.Error(err)
		}
	}
	body, err := kube.Discovery().RESTClient().Get().AbsPath("/readyz").Param("verbose", "true").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"[+]poststarthook/crdipc/bootstrap-roles ok", "[+]poststarthook/crdipc/bootstrap-system-priority-classes ok"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/readyz?verbose has no %q:\n%s", want, body)
		}
	}
	for _, disabled := range []string{"poststarthook/rbac/bootstrap-roles", "poststarthook/scheduling/bootstrap-system-priority-classes"} {
		if strings.Contains(string(body), disabled) {
			t.Errorf("/readyz?verbose still checks %s:\n%s", disabled, body)
		}
	}
}
