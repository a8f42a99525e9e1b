// Package install puts crdipc's CustomResourceDefinitions into a cluster
// with server-side apply and waits until the API server serves them.
// `crdipc up`, `crdipc install` and the test harness all use it, so what a
// user installs is exactly what the tests ran against.
package install
