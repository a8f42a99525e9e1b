// Package podmanifest writes the pod manifests the process-level tests apply with kubectl
// (test/e2e on up's simulated nodes, test/realnode on real kubelets): a pod that runs one
// command once, on a chosen node or where the scheduler puts it, with a claim at /data.
package podmanifest
