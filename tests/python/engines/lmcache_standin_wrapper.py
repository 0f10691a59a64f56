"""STAND-IN of LMCache's NativeConnectorL2Adapter (the wrapper around a
native_plugin object), written from the contract in the project's engine
notes (§4.1), not from LMCache's code: build Cls(**adapter_params), check
the six callables (close() and raise if one is missing), submit_* while
holding the wrapper's lock from several threads, and a demux thread that
polls event_fd() for POLLIN with a 500 ms timeout and calls
drain_completions() under the same lock."""

import importlib
import select
import threading

REQUIRED = ("event_fd", "submit_batch_get", "submit_batch_set", "submit_batch_exists",
            "drain_completions", "close")


class WrapperStandIn:
    def __init__(self, spec):
        cls = getattr(importlib.import_module(spec["module_path"]), spec["class_name"])
        self.obj = cls(**spec.get("adapter_params", {}))
        missing = [m for m in REQUIRED if not callable(getattr(self.obj, m, None))]
        if missing:
            self.obj.close()
            raise TypeError("native plugin lacks %s" % missing)
        self.lock = threading.Lock()
        self.results = {}
        self.unknown = []
        self.done = threading.Condition()
        self.stop = False
        self.wakeups = 0
        self.empty_drains = 0
        self.thread = threading.Thread(target=self._demux, daemon=True)
        self.thread.start()

    def submit(self, method, *args):
        with self.lock:
            fid = getattr(self.obj, method)(*args)
        assert isinstance(fid, int)
        return fid

    def _demux(self):
        p = select.poll()
        p.register(self.obj.event_fd(), select.POLLIN)
        while not self.stop:
            if not p.poll(500):
                continue
            self.wakeups += 1
            with self.lock:
                got = self.obj.drain_completions()
            if not got:
                self.empty_drains += 1
            with self.done:
                for fid, ok, err, bools in got:
                    if fid in self.results:
                        self.unknown.append(fid)          # a duplicate completion
                    self.results[fid] = (ok, err, bools)
                self.done.notify_all()

    def wait(self, fid, timeout=10.0):
        with self.done:
            assert self.done.wait_for(lambda: fid in self.results, timeout), "no completion"
            return self.results[fid]

    def close(self):
        self.stop = True
        self.thread.join()
        self.obj.close()
