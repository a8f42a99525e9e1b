package controlplane

import (
	"runtime/debug"
	"strings"
	"sync"

	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	apimachineryversion "k8s.io/apimachinery/pkg/version"
	"k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/component-base/version"
)

// KubernetesVersion is the version of the k8s.io/kubernetes module this binary is built
// from (v1.37.0), "" when the build carries no module information.
func KubernetesVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, d := range bi.Deps {
		if d.Path == "k8s.io/kubernetes" {
			if d.Replace != nil && d.Replace.Version != "" {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	return ""
}

// reportedVersion is the kube component's effective version with the version clients see
// (GET /version, kubectl version) set to the Kubernetes this binary runs. Kubernetes sets its
// git version at link time (-ldflags -X); a module build such as `go run` or `go install`
// leaves "v0.0.0-master+$Format:%H$", which no client parses: kubectl version fails, and
// Helm's kubeVersion checks or operators gating features on the server version see nonsense.
type reportedVersion struct {
	basecompatibility.MutableEffectiveVersion
	gitVersion string
}

// Info implements basecompatibility.EffectiveVersion.
func (v *reportedVersion) Info() *apimachineryversion.Info {
	info := v.MutableEffectiveVersion.Info()
	if info != nil {
		info.GitVersion = v.gitVersion
		info.GitTreeState = "clean"
		info.GitCommit = "" // unknown, rather than another placeholder
	}
	return info
}

var registerOnce sync.Once

// registerVersion puts reportedVersion in the process-wide component registry, once, before
// kube-apiserver's or kube-controller-manager's options read it. k8s.io/apiserver registers
// the kube component's default version and feature gate at init; the registry can only be
// reset as a whole, so it is reset (before anything has used it) and the same version —
// wrapped — and the same feature gate are registered again.
func registerVersion() {
	registerOnce.Do(func() {
		git := KubernetesVersion()
		if git == "" || !strings.Contains(version.Get().GitVersion, "$Format") {
			return // linked with a real version, or no module information: nothing to fix
		}
		r := compatibility.DefaultComponentGlobalsRegistry
		r.Reset()
		ev := &reportedVersion{MutableEffectiveVersion: compatibility.DefaultBuildEffectiveVersion(), gitVersion: git}
		utilruntime.Must(r.Register(basecompatibility.DefaultKubeComponent, ev, utilfeature.DefaultMutableFeatureGate))
	})
}

// ServerVersion is the version the embedded API server reports.
func ServerVersion() string {
	registerVersion()
	if info := compatibility.DefaultComponentGlobalsRegistry.EffectiveVersionFor(basecompatibility.DefaultKubeComponent).Info(); info != nil {
		return info.GitVersion
	}
	return version.Get().GitVersion
}
