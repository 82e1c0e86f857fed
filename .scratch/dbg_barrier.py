import threading, time, torch
from gpreempt.client import gate as gate_mod
from gpreempt.client.gate import install_gate
from gpreempt.control import ControlBlock
torch.cuda.init()
def mm(n, size=2048):
    a = torch.randn(size, size, device="cuda")
    for _ in range(n):
        a = torch.tanh(a @ a * 1e-3)
    return a
def trial(label, setup, close, opener_fn):
    control = ControlBlock.create(); high = ControlBlock.create()
    gate = install_gate(control, bound=True, auto_activity=False, barrier_ms=0.05)
    setup(gate, high)
    mm(20); torch.cuda.synchronize()
    s0 = gate.stats()["barriers_put"]
    t = time.monotonic(); mm(300, 4096); tl = time.monotonic() - t
    s1 = gate.stats()["barriers_put"]
    close(control, high)
    done = torch.cuda.Event(); done.record()
    op = threading.Timer(0.4, opener_fn, (control, high)); began = time.monotonic(); op.start()
    done.synchronize(); held = time.monotonic() - began; op.join()
    st = gate.stats()
    print(f"{label:40s} launch {tl:.3f}s held {held:.3f}s barriers {s1-s0} window_us {st['window_us']:.0f} err {st['error']} watched {st['watched']} v {st['watch_version']}")
    gate_mod.current_gate().uninstall(); control.close(); high.close()
trial("empty list, 2V", lambda g,h: g.watch([],0), lambda c,h: c.close_while_watched(1), lambda c,h: c.set_gate(False))
trial("empty list, plain 1", lambda g,h: g.watch([],0), lambda c,h: c.set_gate(True), lambda c,h: c.set_gate(False))
trial("list v1, plain 1", lambda g,h: g.watch([h.address],1), lambda c,h: c.set_gate(True), lambda c,h: c.set_gate(False))
trial("list v1, 2V + request", lambda g,h: g.watch([h.address],1), lambda c,h: (h.set_requests(1), c.close_while_watched(1)), lambda c,h: h.set_requests(0))
trial("list v2 (stale), 2V1", lambda g,h: g.watch([h.address],2), lambda c,h: c.close_while_watched(1), lambda c,h: c.set_gate(False))
