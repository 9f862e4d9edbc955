"""tests/support/python/c10d_server.py PORT_FILE [classic]: hosts a c10d TCPStore with PyTorch's own
torch.distributed.TCPStore (the server torchrun's agent runs) on a free port, written to PORT_FILE, for
tests/tools/c10d_store_check.cpp (integration.torchrun). Through its own client it sets /py/hello, sets /py/late 0.5 s
after the C++ client sets /dpt/go, and once the C++ client sets /dpt/done it reads back what that client wrote (keys
from Python go out with a leading "/", which the C++ client's keys carry). Exit 0 when all agree. `classic`: torch
2.x's classic server instead of its default libuv one (use_libuv=False; an error on torch 1.x, which has only one).
"""
import datetime
import sys
import time

import torch.distributed as dist


def main():
    port_file = sys.argv[1]
    kwargs = {}
    if len(sys.argv) > 2 and sys.argv[2] == "classic":
        kwargs["use_libuv"] = False
    timeout = datetime.timedelta(seconds=60)
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout, wait_for_workers=False, **kwargs)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.port))
    import os

    os.rename(port_file + ".tmp", port_file)
    server.set("py/hello", "from python")
    server.wait(["dpt/go"])
    time.sleep(0.5)
    server.set("py/late", "late")
    server.wait(["dpt/done"])
    got = {
        "dpt/a": server.get("dpt/a"),
        "dpt/n": server.get("dpt/n"),
        "dpt/cas": server.get("dpt/cas"),
        "dpt/big": server.get("dpt/big"),
    }
    big = bytes(((i * 2654435761) >> 13) & 0xFF for i in range(4 << 20))
    ok = got["dpt/a"] == b"from dptrain" and got["dpt/n"] == b"3" and got["dpt/cas"] == b"z" and got["dpt/big"] == big
    print(f"python read back: dpt/a {got['dpt/a']!r}, dpt/n {got['dpt/n']!r}, dpt/cas {got['dpt/cas']!r}, "
          f"dpt/big {len(got['dpt/big'])} bytes {'equal' if got['dpt/big'] == big else 'DIFFERENT'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
