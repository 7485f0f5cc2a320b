"""Sets up and drives moto's S3 -> SQS notifications for the trigger tests, with boto3
(nobody here wrote either).

    s3_notify.py ENDPOINT setup BUCKET QUEUE          -> prints the queue URL
    s3_notify.py ENDPOINT put BUCKET KEY TEXT         -> a plain upload
    s3_notify.py ENDPOINT multipart BUCKET KEY        -> a two-part multipart upload
    s3_notify.py ENDPOINT resend QUEUE_URL BUCKET KEY -> the same S3 event record again
    s3_notify.py ENDPOINT sign URL BODY TARGET        -> botocore's X-Amz-Date and
                                                         SigV4 Authorization, a line each
"""

import json
import sys

import boto3

endpoint, op = sys.argv[1], sys.argv[2]
args = sys.argv[3:]
kw = dict(endpoint_url=endpoint, region_name="us-east-1",
          aws_access_key_id="testing", aws_secret_access_key="testing")

if op == "sign":
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    url, body, target = args
    req = AWSRequest(method="POST", url=url, data=body.encode(), headers={
        "content-type": "application/x-amz-json-1.0", "x-amz-target": target})
    SigV4Auth(Credentials("testing", "testing"), "sqs", "us-east-1").add_auth(req)
    print(req.headers["X-Amz-Date"])
    print(req.headers["Authorization"])
    sys.exit(0)

s3 = boto3.client("s3", **kw)
sqs = boto3.client("sqs", **kw)

if op == "setup":
    bucket, queue = args
    s3.create_bucket(Bucket=bucket)
    url = sqs.create_queue(QueueName=queue)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={
        "QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*"]}]})
    print(url)
elif op == "put":
    bucket, key, text = args
    s3.put_object(Bucket=bucket, Key=key, Body=text.encode())
elif op == "multipart":
    bucket, key = args
    up = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    parts = []
    for n, chunk in enumerate([b"a" * (5 << 20), b"b" * 10], start=1):
        e = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=n, Body=chunk)["ETag"]
        parts.append({"PartNumber": n, "ETag": e})
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up,
                                 MultipartUpload={"Parts": parts})
elif op == "resend":
    queue, bucket, key = args
    head = s3.head_object(Bucket=bucket, Key=key)
    record = {"eventVersion": "2.1", "eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
              "s3": {"bucket": {"name": bucket},
                     "object": {"key": key.replace(" ", "+"), "eTag": head["ETag"].strip('"'),
                                "size": head["ContentLength"]}}}
    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"Records": [record]}))
