wrk.method = "POST"
wrk.body = '{"a": 2, "b": 3}'
wrk.headers["Content-Type"] = "application/json"
