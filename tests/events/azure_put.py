"""Puts blobs into Azurite (the Azure Storage emulator) with Microsoft's own SDK, for the
trigger tests.

    azure_put.py BLOB_ENDPOINT create CONTAINER
    azure_put.py BLOB_ENDPOINT put CONTAINER NAME TEXT

BLOB_ENDPOINT is `http://127.0.0.1:PORT/devstoreaccount1`; the account is Azurite's
well-known development account.
"""

import sys

from azure.storage.blob import BlobServiceClient

KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
endpoint, op, container = sys.argv[1:4]
service = BlobServiceClient.from_connection_string(
    f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};BlobEndpoint={endpoint};")
if op == "create":
    service.create_container(container)
elif op == "put":
    name, text = sys.argv[4:6]
    service.get_blob_client(container, name).upload_blob(text.encode())
