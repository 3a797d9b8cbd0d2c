import json, pytest
pytestmark = pytest.mark.integration
def test_probe(slurm_rest):
    doc = slurm_rest._http.get("/openapi/v3", headers={"X-SLURM-USER-TOKEN": slurm_rest.tokens.token()}).json()
    v = slurm_rest.parser
    out = {p: list(doc["paths"][p].keys()) for p in doc["paths"] if "reservation" in p and v in p}
    schemas = doc["components"]["schemas"]
    for p in out:
        for m, op in doc["paths"][p].items():
            if isinstance(op, dict) and "requestBody" in op:
                out[p + " " + m] = op["requestBody"]
    names = [k for k in schemas if "reservation" in k.lower() and v.replace(".", "") in k.replace(".", "")]
    out["schemas"] = {k: schemas[k] for k in names}
    open("/tmp/activecheck-openapi.json", "w").write(json.dumps(out, indent=1))
