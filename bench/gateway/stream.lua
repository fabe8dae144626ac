-- One stream of STREAM_ROWS small rows per request (wrk reads the whole chunked NDJSON body).
wrk.method = "POST"
wrk.body = '{"n": ' .. (os.getenv("STREAM_ROWS") or "10000") .. '}'
wrk.headers["Content-Type"] = "application/json"
