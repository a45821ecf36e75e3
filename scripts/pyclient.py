"""Reference Python client for Cellfleet: signs envelopes using only the documented rule.

The rule (proto/cellfleet/v1/envelope.proto): serialize the body message,
prepend the call's domain tag (ASCII + one zero byte), sign the result with
pure Ed25519, and send SignedEnvelope{body, signature, key_id}. Errors carry
a serialized cellfleet.v1.ErrorDetail in the "cellfleet-error-bin" trailer.

Prints one JSON object per call on stdout.
"""

import argparse
import json
import os
import sys
import time

import grpc
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from cellfleet.v1 import client_pb2, client_pb2_grpc, envelope_pb2, errors_pb2

COMMAND_TAG = b"cellfleet.v1.command\x00"
QUERY_TAG = b"cellfleet.v1.query\x00"


def seal(tag, body, key_id, private_key):
    body_bytes = body.SerializeToString()
    signature = private_key.sign(tag + body_bytes)
    return envelope_pb2.SignedEnvelope(body=body_bytes, signature=signature, key_id=key_id)


def error_detail(error):
    for key, value in error.trailing_metadata() or ():
        if key == "cellfleet-error-bin":
            detail = errors_pb2.ErrorDetail()
            detail.ParseFromString(value)
            return detail
    return None


def call(method, request):
    try:
        response = method(request, timeout=10)
        return {"ok": True, "response": response}
    except grpc.RpcError as error:
        detail = error_detail(error)
        return {
            "ok": False,
            "status": error.code().name,
            "error_code": errors_pb2.ErrorCode.Name(detail.code) if detail else None,
            "retry_safe": detail.retry_safe if detail else None,
            "message": error.details(),
        }


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--addr", required=True, help="host:port of a node's client listener")
    parser.add_argument("--server-name", default="localhost", help="name in the node certificate")
    parser.add_argument("--ca", required=True, help="cluster CA certificate (PEM)")
    parser.add_argument("--cert", required=True, help="client certificate (PEM)")
    parser.add_argument("--key", required=True, help="client TLS private key (PEM)")
    parser.add_argument("--signing-key", required=True, help="Ed25519 private key (PKCS#8 PEM)")
    parser.add_argument("--key-id", required=True)
    parser.add_argument("--kind", default="kv")
    parser.add_argument("--cell-key", default="py-cell")
    parser.add_argument("--command", default="put")
    parser.add_argument("--args", default='{"key": "greeting", "value": "hello from python"}')
    parser.add_argument("--tamper", action="store_true", help="also send a wrongly signed copy")
    options = parser.parse_args()

    def read(path):
        with open(path, "rb") as file:
            return file.read()

    signing_key = load_pem_private_key(read(options.signing_key), password=None)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=read(options.ca),
        private_key=read(options.key),
        certificate_chain=read(options.cert),
    )
    channel = grpc.secure_channel(
        options.addr,
        credentials,
        options=[("grpc.ssl_target_name_override", options.server_name)],
    )
    stub = client_pb2_grpc.ClientStub(channel)

    now_ms = int(time.time() * 1000)
    command_id = os.urandom(16)
    body = envelope_pb2.CommandBody(
        kind=options.kind,
        key=options.cell_key.encode(),
        command=options.command,
        args_json=json.dumps(json.loads(options.args)).encode(),
        command_id=command_id,
        issued_at_ms=now_ms,
        expires_at_ms=now_ms + 60_000,
    )
    envelope = seal(COMMAND_TAG, body, options.key_id, signing_key)
    results = {}
    outcome = call(stub.Execute, client_pb2.ExecuteRequest(envelope=envelope))
    if outcome["ok"]:
        response = outcome.pop("response")
        outcome.update(
            command_id_matches=response.command_id == command_id,
            served_by=response.served_by,
            result=json.loads(response.result_json) if response.HasField("result_json") else None,
            receipt={
                "cell_id": response.receipt.cell_id,
                "epoch": response.receipt.epoch,
                "txid": response.receipt.txid,
            },
        )
    results["execute"] = outcome

    if options.tamper:
        bad = envelope_pb2.SignedEnvelope()
        bad.CopyFrom(envelope)
        bad.signature = bytes([bad.signature[0] ^ 1]) + bad.signature[1:]
        results["tampered_signature"] = call(stub.Execute, client_pb2.ExecuteRequest(envelope=bad))
        # A command signature replayed as a query must not verify.
        replay = envelope_pb2.SignedEnvelope()
        replay.CopyFrom(envelope)
        results["cross_domain"] = call(stub.Query, client_pb2.QueryRequest(envelope=replay))

    json.dump(results, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0 if results["execute"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
