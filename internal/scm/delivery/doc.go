// Package delivery builds webhook deliveries as GitHub sends them: a POST of the event's
// JSON body with its event name, its delivery ID and the body's HMAC-SHA256 under the
// webhook's secret in X-Hub-Signature-256 (GitHub's "Validating webhook deliveries"). The
// tests and `crdipc bench webhook` send them to the listener; the listener's own
// validation (go-github's ValidateSignature) is not this package.
package delivery
