"""Keep requests in flight through a load balancer: each sends its headers and
a first part of its body, then waits, so HAProxy holds a server session for
it. Closes them when the stop file appears.

Usage: hold_request.py HOST PORT COUNT CA_FILE KEY_FILE STOP_FILE
(with the API key, so vLLM waits for the body instead of answering 401)
"""

import socket
import ssl
import sys
import time


def main(host, port, count, ca_file, key_file, stop_file):
    with open(key_file) as handle:
        key = handle.read().strip().encode()
    context = ssl.create_default_context(cafile=ca_file)
    held = []
    for _request in range(count):
        conn = context.wrap_socket(socket.create_connection((host, port), timeout=10), server_hostname=host)
        conn.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: lb\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + key + b"\r\n"
            b"Content-Length: 100000\r\n\r\n{\"model\": \"tiny-llama\", "
        )
        held.append(conn)
    print(f"holding {len(held)} requests", flush=True)
    while True:
        try:
            open(stop_file).close()
            break
        except FileNotFoundError:
            time.sleep(0.5)
    for conn in held:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]))
