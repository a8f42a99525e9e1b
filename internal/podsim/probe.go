package podsim

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// prober runs one container's readiness probe (tcpSocket or httpGet) against the pod
// IP, as kubelet does: after initialDelaySeconds, every periodSeconds, each attempt
// bounded by timeoutSeconds; ready after successThreshold successes in a row, unready
// after failureThreshold failures in a row; unready until the first success.
type prober struct {
	probe     *corev1.Probe
	container *corev1.Container
	ip        string
	forward   map[int32]string // container port → where the process really listens
}

func (p *prober) run(ctx context.Context, set func(ready bool)) {
	period := seconds(p.probe.PeriodSeconds, 10)
	timeout := seconds(p.probe.TimeoutSeconds, 1)
	successes, failures := 0, 0
	needSuccesses := max(int(p.probe.SuccessThreshold), 1)
	needFailures := max(int(p.probe.FailureThreshold), 1)
	ready := false
	timer := time.NewTimer(time.Duration(p.probe.InitialDelaySeconds) * time.Second)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		attempt, cancel := context.WithTimeout(ctx, timeout)
		err := p.once(attempt)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			successes, failures = successes+1, 0
			if !ready && successes >= needSuccesses {
				ready = true
				set(true)
			}
		} else {
			successes, failures = 0, failures+1
			if ready && failures >= needFailures {
				ready = false
				set(false)
			}
		}
		timer.Reset(period)
	}
}

func seconds(n, def int32) time.Duration {
	if n <= 0 {
		n = def
	}
	return time.Duration(n) * time.Second
}

// address is host:port for a probe, or where a forwarded pod port really goes.
func (p *prober) address(host string, port intstr.IntOrString) (string, error) {
	n, err := p.port(port)
	if err != nil {
		return "", err
	}
	if host == "" || host == p.ip {
		host = p.ip
		if target, ok := p.forward[n]; ok {
			return target, nil
		}
	}
	return net.JoinHostPort(host, strconv.Itoa(int(n))), nil
}

func (p *prober) port(port intstr.IntOrString) (int32, error) {
	if port.Type == intstr.Int {
		return port.IntVal, nil
	}
	for _, cp := range p.container.Ports {
		if cp.Name == port.StrVal {
			return cp.ContainerPort, nil
		}
	}
	if n, err := strconv.Atoi(port.StrVal); err == nil {
		return int32(n), nil
	}
	return 0, fmt.Errorf("container %s has no port named %q", p.container.Name, port.StrVal)
}

// once runs the probe one time; nil is success.
func (p *prober) once(ctx context.Context) error {
	switch {
	case p.probe.TCPSocket != nil:
		addr, err := p.address(p.probe.TCPSocket.Host, p.probe.TCPSocket.Port)
		if err != nil {
			return err
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	case p.probe.HTTPGet != nil:
		return p.httpGet(ctx, p.probe.HTTPGet)
	}
	return nil
}

func (p *prober) httpGet(ctx context.Context, g *corev1.HTTPGetAction) error {
	addr, err := p.address(g.Host, g.Port)
	if err != nil {
		return err
	}
	n, _ := p.port(g.Port)
	host := g.Host
	if host == "" {
		host = p.ip
	}
	scheme := strings.ToLower(string(g.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	path := g.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	u := &url.URL{Scheme: scheme, Host: addr}
	if pu, err := url.Parse(path); err == nil {
		u.Path, u.RawQuery = pu.Path, pu.RawQuery
	} else {
		u.Path = path
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Host = net.JoinHostPort(host, strconv.Itoa(int(n)))
	req.Header.Set("User-Agent", "kube-probe/podsim")
	req.Header.Set("Accept", "*/*")
	for _, h := range g.HTTPHeaders {
		if strings.EqualFold(h.Name, "Host") {
			req.Host = h.Value
			continue
		}
		req.Header.Add(h.Name, h.Value)
	}
	client := &http.Client{
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // as kubelet: probes do not verify
			DisableKeepAlives: true,
			Proxy:             nil,
		},
		// A redirect is an answer: kubelet counts 3xx as success too.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode < http.StatusOK || resp.StatusCode >= http.StatusBadRequest {
		return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
	}
	return nil
}
