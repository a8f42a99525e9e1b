// The console page: one EventSource on /events, each message a full snapshot (see
// internal/console.Snapshot) that replaces what is shown. Plain DOM, no framework.
'use strict';
(function () {
  const $ = (id) => document.getElementById(id);

  // h builds an element: h('td', {class: 'x', 'data-y': 1}, child, 'text', ...). Text always
  // goes through text nodes, never innerHTML: names and messages come from the cluster.
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null && v !== false) el.setAttribute(k, v === true ? '' : String(v));
    }
    for (const k of kids.flat()) {
      if (k === undefined || k === null || k === false) continue;
      el.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return el;
  }

  const OK = ['Healthy', 'Succeeded', 'Ready', 'Running', 'Bound', 'True', 'open', 'created'];
  const BAD = ['Offline', 'Error', 'Failed', 'InvalidSpec', 'PoolCreationFailed', 'DeletionFailed', 'NotReady', 'gone', 'closed', 'deleted'];
  function phase(p) {
    const text = p || 'Unknown';
    const cls = OK.includes(text) ? 'ok' : BAD.includes(text) ? 'bad' : 'warn';
    return h('span', { class: 'phase ' + cls }, text);
  }

  function table(headers, rows, empty) {
    if (!rows.length) return h('p', { class: 'empty' }, empty);
    return h('table', {}, h('thead', {}, h('tr', {}, headers.map((x) => h('th', {}, x)))), h('tbody', {}, rows));
  }

  function latency(ms, approx) {
    if (ms < 0) return '—';
    let s;
    if (ms < 1000) s = ms + ' ms';
    else if (ms < 60000) s = (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + ' s';
    else s = Math.floor(ms / 60000) + ' min ' + Math.round((ms % 60000) / 1000) + ' s';
    return (approx ? '≈ ' : '') + s;
  }

  // Ages are rendered as spans that a timer keeps current between snapshots.
  function age(t) {
    return h('span', { class: 'age muted', 'data-t': t }, ago(t));
  }
  function ago(t) {
    const s = Math.max(0, Math.round((Date.now() - Date.parse(t)) / 1000));
    if (s < 60) return s + ' s ago';
    if (s < 3600) return Math.floor(s / 60) + ' min ago';
    return Math.floor(s / 3600) + ' h ago';
  }
  setInterval(() => {
    for (const el of document.querySelectorAll('.age')) el.textContent = ago(el.dataset.t);
  }, 1000);

  const key = (ns, name) => (ns ? ns + '/' + name : name);

  // Trace links show only when the console serves traces (snapshot.tracing); a link opens the
  // waterfall through the location hash, #trace=<id>, so the panel has a URL of its own.
  let tracing = false;
  let shownTrace = null;
  function traceLink(id) {
    if (!tracing || !id) return null;
    return h('a', { class: 'trace-link' + (id === shownTrace ? ' active' : ''), href: '#trace=' + id, 'data-trace': id, title: 'show the trace ' + id }, 'trace');
  }

  function renderNodes(nodes) {
    if (!nodes.length) return [h('p', { class: 'empty' }, 'no nodes')];
    return nodes.map((n) => h('div', { class: 'node', 'data-node': n.name },
      h('div', { class: 'title' }, n.name, ' ', phase(n.gone ? 'gone' : n.ready ? 'Ready' : 'NotReady'),
        n.simulated ? h('span', { class: 'muted' }, ' simulated') : null),
      n.pools.length ? n.pools.map((p) => h('div', { class: 'pool', 'data-pool': p.name },
        h('div', {}, h('span', { class: 'mono' }, p.name), ' ', phase(p.phase),
          p.total ? h('span', { class: 'muted' }, ' ', p.used ? p.used + ' of ' : '', p.total) : null),
        p.replicas.length ? h('ul', {}, p.replicas.map(replica)) : h('p', { class: 'empty' }, 'no replicas'))) :
        h('p', { class: 'empty' }, 'no pools')));
  }

  function replica(r) {
    let rebuild = null;
    if (r.rebuild) {
      const pct = r.rebuild.percent;
      rebuild = h('span', { class: 'rebuild', 'data-percent': pct >= 0 ? pct.toFixed(0) : '' }, ' ',
        pct >= 0 ? h('span', { class: 'bar' }, h('span', { style: 'width:' + pct.toFixed(1) + '%' })) : null,
        ' ', pct >= 0 ? pct.toFixed(0) + '%' : r.rebuild.progress || 'rebuilding',
        r.rebuild.source ? h('span', { class: 'muted' }, ' from ' + r.rebuild.source) : null,
        r.rebuild.error ? h('span', { class: 'msg' }, ' ' + r.rebuild.error) : null);
    }
    return h('li', { 'data-replica': key(r.namespace, r.name), 'data-phase': r.phase },
      phase(r.phase), ' ', h('span', { class: 'mono' }, key(r.namespace, r.volume)),
      r.used ? h('span', { class: 'muted' }, ' ' + r.used + ' used') : null, rebuild);
  }

  function renderVolumes(vols) {
    return table(['volume', 'phase', 'replicas', 'size', 'claim', 'used on', 'status'], vols.map((v) => {
      const used = (v.users || []).map((u) => h('div', { 'data-user': u.pod },
        h('b', {}, u.node || 'unscheduled'), ' ', h('span', { class: 'muted' }, u.pod + ' (' + (u.phase || 'Pending') + ')')));
      if (!used.length && v.published && v.published.length) used.push(h('b', {}, v.published.join(', ')));
      return h('tr', { 'data-volume': key(v.namespace, v.name), 'data-phase': v.phase },
        h('td', { class: 'mono' }, key(v.namespace, v.name)), h('td', {}, phase(v.phase)),
        h('td', { class: 'replicas nowrap' }, v.ready + '/' + v.desired), h('td', { class: 'nowrap' }, v.capacity),
        h('td', { class: 'mono' }, v.claim || '—'), h('td', { class: 'used' }, used.length ? used : '—'),
        h('td', { class: 'msg' }, v.message || ''));
    }), 'no volumes');
  }

  function renderInFlight(reqs) {
    return table(['kind', 'name', 'reason', 'since'], reqs.map((r) =>
      h('tr', { 'data-request': r.kind + '/' + key(r.namespace, r.name), 'data-trace': r.traceId },
        h('td', {}, r.kind), h('td', {}, h('span', { class: 'mono' }, key(r.namespace, r.name)), traceLink(r.traceId)),
        h('td', {}, phase(r.reason), r.message ? h('div', { class: 'msg' }, r.message) : null),
        h('td', { class: 'nowrap' }, age(r.since)))), 'nothing in flight');
  }

  function renderCompleted(cs) {
    return table(['kind', 'name', 'result', 'latency', 'done'], cs.map((c) =>
      h('tr', { 'data-completion': c.kind + '/' + key(c.namespace, c.name), 'data-latency-ms': c.latencyMs, 'data-trace': c.traceId },
        h('td', {}, c.kind), h('td', {}, h('span', { class: 'mono' }, key(c.namespace, c.name)), traceLink(c.traceId)),
        h('td', {}, phase(c.succeeded ? 'Succeeded' : c.reason), !c.succeeded && c.message ? h('div', { class: 'msg' }, c.message) : null),
        h('td', { class: 'latency nowrap', title: c.approx ? 'from API timestamps (whole seconds)' : 'as watched by the console' }, latency(c.latencyMs, c.approx)),
        h('td', { class: 'nowrap' }, age(c.at)))), 'no completions yet');
  }

  function renderDeliveries(ds) {
    return table(['delivery', 'reason', 'object', 'when'], ds.map((d) =>
      h('tr', { 'data-delivery': d.delivery },
        h('td', { class: 'mono' }, (d.delivery || '').slice(0, 8)),
        h('td', {}, d.reason, d.message ? h('div', { class: 'msg' }, d.message) : null),
        h('td', { class: 'mono' }, d.kind + ' ' + d.object), h('td', { class: 'nowrap' }, age(d.time)))), 'no deliveries yet');
  }

  function renderSCM(prs, brs) {
    const out = [];
    if (prs.length) out.push(h('p', {}, h('b', {}, 'Pull requests '), prs.map((p) =>
      h('span', { 'data-pr': p.name }, p.repository + '#' + p.number + ' ', phase(p.merged ? 'merged' : p.state), ' ', h('span', { class: 'muted' }, p.user), '  '))));
    if (brs.length) out.push(h('p', {}, h('b', {}, 'Branches '), brs.map((b) =>
      h('span', { 'data-branch': b.name }, b.repository + ':' + b.branch + ' ', phase(b.state), '  '))));
    return out;
  }

  function renderNetworks(ns) {
    if (!ns.length) return [h('p', { class: 'empty' }, 'no networks')];
    return ns.map((n) => h('div', { class: 'network', 'data-network': key(n.namespace, n.name) },
      h('div', {}, h('b', { class: 'mono' }, key(n.namespace, n.name)), ' ', phase(n.ready ? 'Ready' : n.reason || 'Pending'),
        ' ', n.readyNodes + '/' + n.nodes + ' nodes ready, ' + n.peers + ' peer link' + (n.peers === 1 ? '' : 's')),
      n.message ? h('div', { class: 'msg' }, n.message) : null,
      (n.members || []).length ? h('ul', {}, n.members.map((m) =>
        h('li', {}, h('span', { class: 'mono' }, m.name), ' ', m.ip || '', ' ', phase(m.ready ? 'Ready' : 'NotReady')))) : null));
  }

  function renderBackups(bs) {
    return table(['backup', 'phase', 'volume', 'store', 'progress', 'uploaded', 'message'], bs.map((b) =>
      h('tr', { 'data-backup': key(b.namespace, b.name), 'data-phase': b.phase },
        h('td', { class: 'mono' }, key(b.namespace, b.name)), h('td', {}, phase(b.phase)),
        h('td', { class: 'mono' }, b.volume || '—'), h('td', { class: 'mono' }, b.store),
        h('td', { class: 'nowrap' }, b.percent >= 0 ? b.percent + '% of ' + b.size + (b.node ? ' on ' + b.node : '') : '—'),
        h('td', { class: 'nowrap' }, (b.uploaded || '—') + (b.throughput ? ' at ' + b.throughput : '')),
        h('td', { class: 'msg' }, b.message || ''))), 'no backups');
  }

  function render(s) {
    tracing = !!s.tracing;
    $('nodes').replaceChildren(...renderNodes(s.nodes));
    $('volumes').replaceChildren(renderVolumes(s.volumes));
    $('inflight').replaceChildren(renderInFlight(s.inFlight));
    $('completed').replaceChildren(renderCompleted(s.completed));
    $('deliveries').replaceChildren(renderDeliveries(s.deliveries));
    $('scm').replaceChildren(...renderSCM(s.pullRequests, s.branches));
    $('networks').replaceChildren(...renderNetworks(s.networks));
    $('backups').replaceChildren(renderBackups(s.backups));
    const om = Object.entries(s.omitted || {}).map(([k, v]) => v + ' more ' + k);
    $('omitted').textContent = om.length ? 'Not shown: ' + om.join(', ') + '.' : '';
    $('updated').textContent = 'updated ' + new Date(s.time).toLocaleTimeString();
    document.body.dataset.snapshots = String(Number(document.body.dataset.snapshots || 0) + 1);
  }

  // ms formats a span's duration: sub-millisecond spans (a cache read) keep their digits.
  function ms(v) {
    if (v < 1) return v.toFixed(3) + ' ms';
    if (v < 100) return v.toFixed(1) + ' ms';
    return latency(Math.round(v), false);
  }

  // renderWaterfall draws GET /traces/<id>: the spans in the tree's order (each under its
  // parent, children by start), indented by depth, each bar placed at its start from the
  // trace's start and sized by its duration, both as fractions of the whole trace.
  function renderWaterfall(t) {
    const byId = new Map(t.spans.map((s) => [s.spanId, s]));
    const total = t.durationMs;
    const rows = [];
    const walk = (nodes) => {
      for (const n of nodes || []) {
        const s = byId.get(n.spanId);
        if (s) rows.push(spanRow(s, total));
        walk(n.children);
      }
    };
    walk(t.tree);
    const summary = h('p', { class: 'summary muted' }, t.spans.length + ' span' + (t.spans.length === 1 ? '' : 's') + ' over ' + ms(total),
      ', from ' + new Date(t.start).toLocaleTimeString(),
      t.dropped ? h('span', { class: 'msg' }, ' — ' + t.dropped + ' more not kept') : null);
    return [summary, ...rows];
  }

  function spanRow(s, total) {
    const left = total > 0 ? (s.offsetMs / total) * 100 : 0;
    const width = total > 0 ? (s.durationMs / total) * 100 : 100;
    const orphan = s.root && !!s.parentSpanId;
    const about = [s.kind + ' span, +' + ms(s.offsetMs) + ', ' + ms(s.durationMs)];
    if (orphan) about.push('its parent ' + s.parentSpanId + ' is not in this trace');
    if (s.failed) about.push('failed: ' + (s.error || 'error'));
    for (const [k, v] of Object.entries(s.attributes || {})) about.push(k + ' = ' + v);
    return h('div', {
      class: 'span-row' + (s.failed ? ' failed' : '') + (orphan ? ' orphan' : ''), title: about.join('\n'),
      'data-span-id': s.spanId, 'data-parent-span-id': s.parentSpanId, 'data-service': s.service, 'data-name': s.name,
      'data-depth': s.depth, 'data-duration-ms': s.durationMs, 'data-failed': s.failed, 'data-root': s.root,
    },
    h('div', { class: 'span-label', style: 'padding-left:' + Math.min(s.depth, 20) * 1.1 + 'em' },
      s.failed ? h('span', { class: 'span-fail' }, '✕ ') : null,
      h('span', { class: 'span-service' }, s.service || '?'), ' · ', h('span', { class: 'span-name' }, s.name)),
    h('div', { class: 'span-track' }, h('span', { class: 'span-bar', style: 'left:' + left.toFixed(3) + '%;width:' + width.toFixed(3) + '%' })),
    h('div', { class: 'span-ms' }, ms(s.durationMs)));
  }

  // A trace's spans keep arriving for a moment after its request is answered (a receiver's
  // reconcile ends after the status write the sender saw; other processes export in
  // batches), so an open trace is read again every second for its first half minute, and
  // redrawn when it has more spans.
  const followMs = 30000;
  let followTimer = null;

  // openTrace shows trace id in the panel. Its state is on #waterfall for tests to wait on:
  // data-state is loading, ready, missing (not kept, or tracing off) or error. follow is set
  // on the quiet re-reads: they show no "loading…" and redraw only what changed.
  async function openTrace(id, follow) {
    clearTimeout(followTimer);
    shownTrace = id;
    const wf = $('waterfall');
    if (!follow) {
      follow = { since: Date.now() };
      $('trace').hidden = false;
      $('trace-id').textContent = id;
      wf.dataset.trace = id;
      wf.dataset.state = 'loading';
      wf.replaceChildren(h('p', { class: 'empty' }, 'loading…'));
      for (const a of document.querySelectorAll('a.trace-link')) a.classList.toggle('active', a.dataset.trace === id);
    }
    let state, kids, spans = 0;
    try {
      const res = await fetch('traces/' + encodeURIComponent(id), { cache: 'no-store' });
      if (res.ok) {
        const t = await res.json();
        state = 'ready';
        spans = t.spans.length;
        kids = renderWaterfall(t);
      } else {
        state = res.status === 404 ? 'missing' : 'error';
        kids = [h('p', { class: 'empty' }, (await res.text()).trim())];
      }
    } catch (e) {
      state = 'error';
      kids = [h('p', { class: 'empty' }, 'cannot read the trace: ' + e)];
    }
    if (shownTrace !== id) return; // another trace was opened (or it was closed) meanwhile
    if (!follow.shown || state !== wf.dataset.state || String(spans) !== wf.dataset.spans) {
      wf.replaceChildren(...kids);
      wf.dataset.spans = String(spans);
      wf.dataset.state = state;
    }
    follow.shown = true;
    if (state !== 'error' && Date.now() - follow.since < followMs) {
      followTimer = setTimeout(() => openTrace(id, follow), 1000);
    }
  }

  function closeTrace() {
    clearTimeout(followTimer);
    shownTrace = null;
    $('trace').hidden = true;
    $('waterfall').replaceChildren();
    delete $('waterfall').dataset.trace;
    delete $('waterfall').dataset.state;
    for (const a of document.querySelectorAll('a.trace-link.active')) a.classList.remove('active');
  }

  function traceInHash() {
    const m = /(?:^#|&)trace=([^&]+)/.exec(location.hash);
    return m ? decodeURIComponent(m[1]) : null;
  }

  function onHash() {
    const id = traceInHash();
    if (id) {
      openTrace(id);
      $('trace').scrollIntoView({ block: 'nearest' });
    } else {
      closeTrace();
    }
  }
  window.addEventListener('hashchange', onHash);
  // A link to the trace already in the hash changes nothing: read it again instead.
  document.addEventListener('click', (e) => {
    const a = e.target.closest && e.target.closest('a.trace-link');
    if (a && traceInHash() === a.dataset.trace) {
      e.preventDefault();
      openTrace(a.dataset.trace);
    }
  });
  $('trace-reload').addEventListener('click', () => { if (shownTrace) openTrace(shownTrace); });
  $('trace-close').addEventListener('click', () => {
    history.replaceState(null, '', location.pathname + location.search);
    closeTrace();
  });
  onHash();

  function setConn(state, text) {
    const el = $('conn');
    el.className = 'conn ' + state;
    el.textContent = text;
  }

  // EventSource reconnects by itself after a dropped connection; only a refused one (up
  // restarting answers with an error) closes it for good, so that case reconnects by hand.
  function connect() {
    const es = new EventSource('events');
    es.onmessage = (e) => {
      setConn('live', 'live');
      render(JSON.parse(e.data));
    };
    es.onerror = () => {
      setConn('reconnecting', 'reconnecting…');
      if (es.readyState === EventSource.CLOSED) setTimeout(connect, 2000);
    };
  }
  connect();
})();
