#!/usr/bin/env python3
"""A scripted S3-like HTTP server on loopback for objstore_test's fault cases.

  fault_server.py PORT_FILE MODE [SIZE]

Every path names one object of SIZE bytes (default 1 MiB) whose byte i is (i * 131 + 7) % 251,
served with ETag "v1" to HEAD and (ranged) GET. MODE scripts the faults:
  drop:N        the first N GETs send their headers and half the body, then close the connection
  slowdown:N    the first N requests get 503 SlowDown (S3's throttling answer)
  signature     every request gets 403 SignatureDoesNotMatch
  delay:MS      every request waits MS milliseconds before it is answered
  sigv4:SECRET  requests must carry a valid SigV4 signature for access key AKIDEXAMPLE and SECRET,
                checked with botocore's signer (python3-botocore): else 403 InvalidAccessKeyId or
                SignatureDoesNotMatch, as S3 answers. Also answers ListObjectsV2 (GET /bucket?...)
                with one object, accepts PUT (checking x-amz-content-sha256 against the body) and
                the steps of a multipart upload (POST ?uploads=, PUT ?partNumber=&uploadId=,
                POST ?uploadId=, DELETE ?uploadId=)
  partfail      multipart uploads whose second part is refused with 403 AccessDenied (no
                signature check); everything else as in sigv4 mode
  drop_change   the first GET sends half its body with ETag "v1" and closes; from then on the
                object is another version (ETag "v2", other bytes)
Writes the port it listens on to PORT_FILE, and one line per request to stdout:
  "GET /bucket/key bytes=START-END port=CLIENT_PORT" (the client's port tells connections apart)."""
import hashlib
import hmac
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT_FILE, MODE = sys.argv[1], sys.argv[2]
SIZE = int(sys.argv[3]) if len(sys.argv) > 3 else 1 << 20
KIND, _, COUNT = MODE.partition(":")
ACCESS_KEY = "AKIDEXAMPLE"
SECRET = COUNT if KIND == "sigv4" else ""
STATE = {"faults_left": int(COUNT) if COUNT and KIND in ("drop", "slowdown") else 1, "version": 1}


def content(version):
    base = bytes((i * 131 + 7) % 251 for i in range(251))
    data = (base * (SIZE // 251 + 1))[:SIZE]
    return data if version == 1 else bytes(255 - b for b in data)


BODIES = {1: content(1), 2: content(2)}
LOG_LOCK = threading.Lock()


def check_signature(handler, body):
    """None when the request's SigV4 signature is valid for ACCESS_KEY and SECRET, else the S3 code."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    m = re.match(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/s3/aws4_request, ?"
                 r"SignedHeaders=([^,]+), ?Signature=([0-9a-f]{64})$", handler.headers.get("Authorization", ""))
    if not m:
        return "AccessDenied"
    key, _, region, signed, signature = m.groups()
    if key != ACCESS_KEY:
        return "InvalidAccessKeyId"
    sha = handler.headers.get("x-amz-content-sha256", "")
    if sha != "UNSIGNED-PAYLOAD" and sha != hashlib.sha256(body).hexdigest():
        return "XAmzContentSHA256Mismatch"
    headers = {h: handler.headers.get(h, "") for h in signed.split(";")}
    request = AWSRequest(method=handler.command, url="http://" + handler.headers["Host"] + handler.path,
                         headers=headers, data=body)
    request.context["timestamp"] = handler.headers.get("X-Amz-Date", "")
    signer = S3SigV4Auth(Credentials(ACCESS_KEY, SECRET), "s3", region)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    if hmac.compare_digest(expected, signature):
        return None
    with LOG_LOCK:
        sys.stdout.write("signature mismatch; canonical request:\n" + canonical + "\n")
    return "SignatureDoesNotMatch"


def list_xml():
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult><IsTruncated>false</IsTruncated>'
            f'<Contents><Key>prefix/obj</Key><ETag>&quot;v1&quot;</ETag><Size>{SIZE}</Size></Contents>'
            f'</ListBucketResult>').encode()


def multipart_reply(handler):
    """The body of a multipart step's answer, or None when the request is not one."""
    if handler.command == "POST" and "uploads=" in handler.path:
        return (b'<?xml version="1.0" encoding="UTF-8"?>\n<InitiateMultipartUploadResult><UploadId>up+load/1'
                b'</UploadId></InitiateMultipartUploadResult>')
    if handler.command == "POST" and "uploadId=" in handler.path:
        return (b'<?xml version="1.0" encoding="UTF-8"?>\n<CompleteMultipartUploadResult><ETag>&quot;whole-3&quot;'
                b'</ETag></CompleteMultipartUploadResult>')
    if handler.command in ("PUT", "DELETE") and "uploadId=" in handler.path:
        return b""
    return None


def error_xml(code, message):
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f'<Message>{message}</Message></Error>').encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_error_xml(self, status, code, message):
        body = error_xml(code, message)
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def serve(self):
        rng = self.headers.get("Range", "")
        with LOG_LOCK:  # one write per line: handler threads must not interleave
            sys.stdout.write(f"{self.command} {self.path} {rng} port={self.client_address[1]}\n")
            sys.stdout.flush()
        if KIND == "delay":
            time.sleep(int(COUNT) / 1000)
        if KIND in ("sigv4", "partfail"):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            code = check_signature(self, body) if KIND == "sigv4" else None
            if code:
                return self.send_error_xml(403, code, "refused by fault_server.py")
            if KIND == "partfail" and "partNumber=2&" in self.path:
                return self.send_error_xml(403, "AccessDenied", "part refused by fault_server.py")
            reply = multipart_reply(self)
            if reply is not None:
                self.send_response(204 if self.command == "DELETE" else 200)
                self.send_header("ETag", f'"part-{len(body)}"')
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)
                return
            if self.command == "PUT" or "?" in self.path:
                reply = list_xml() if "?" in self.path else b""
                self.send_response(200)
                self.send_header("ETag", '"v1"')
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)
                return
        if KIND == "signature":
            return self.send_error_xml(403, "SignatureDoesNotMatch", "The request signature we calculated "
                                       "does not match the signature you provided.")
        if KIND == "slowdown" and STATE["faults_left"] > 0:
            STATE["faults_left"] -= 1
            return self.send_error_xml(503, "SlowDown", "Please reduce your request rate.")
        version = STATE["version"]
        body = BODIES[version]
        start, end = 0, SIZE - 1
        if rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start, end = int(a), min(int(b), SIZE - 1)
        part = body[start:end + 1]
        self.send_response(206 if rng else 200)
        self.send_header("ETag", f'"v{version}"')
        self.send_header("Content-Length", str(len(part)))
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{end}/{SIZE}")
        self.end_headers()
        if self.command == "HEAD":
            return
        drop = KIND in ("drop", "drop_change") and STATE["faults_left"] > 0
        if not drop:
            self.wfile.write(part)
            return
        STATE["faults_left"] -= 1
        if KIND == "drop_change":
            STATE["version"] = 2
        self.wfile.write(part[:len(part) // 2])
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True

    do_GET = serve
    do_HEAD = serve
    do_PUT = serve
    do_POST = serve
    do_DELETE = serve


def main():
    if KIND == "sigv4":
        try:
            import botocore.auth  # noqa: F401
        except ImportError:
            sys.exit("fault_server.py: python3-botocore is missing: run `make setup`")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(PORT_FILE + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    import os
    os.rename(PORT_FILE + ".tmp", PORT_FILE)
    server.serve_forever()


if __name__ == "__main__":
    main()
