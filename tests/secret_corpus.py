"""Real-shaped, never real, secrets and their look-alikes, generated for the privacy tests.

Every secret is drawn from a seeded RNG in the shape its issuer uses (prefix, alphabet,
length), so it matches what a scanner must catch and cannot be anyone's credential.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import string
import uuid

ALNUM = string.ascii_letters + string.digits
UPPER = string.ascii_uppercase + string.digits
B64 = ALNUM + "+/"
URLSAFE = ALNUM + "-_"


def _r(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def secrets(seed: int = 7) -> list[tuple[str, str, str]]:
    """(kind, the secret, how it is written in text) for every kind memd recognises."""
    rng = random.Random(seed)
    jwt_head = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').decode().rstrip("=")
    jwt_body = (
        base64.urlsafe_b64encode(
            json.dumps({"sub": _r(rng, ALNUM, 12), "iat": 1700000000}).encode()
        )
        .decode()
        .rstrip("=")
    )
    jwt = f"{jwt_head}.{jwt_body}.{_r(rng, URLSAFE, 43)}"
    pem_body = "\n".join(_r(rng, B64, 64) for _ in range(6))
    pem = f"-----BEGIN RSA PRIVATE KEY-----\n{pem_body}\n-----END RSA PRIVATE KEY-----"
    aws_secret = _r(rng, B64, 40)
    url_pw = _r(rng, ALNUM, 18)
    pw = _r(rng, ALNUM, 14) + "!7"
    bearer = _r(rng, URLSAFE, 40)
    rows = [
        ("openai-api-key", "sk-proj-" + _r(rng, URLSAFE, 74) + "T3BlbkFJ" + _r(rng, URLSAFE, 74)),
        ("openai-api-key", "sk-" + _r(rng, ALNUM, 48)),
        ("anthropic-api-key", "sk-ant-api03-" + _r(rng, URLSAFE, 93) + "AA"),
        ("google-api-key", "AIza" + _r(rng, URLSAFE, 35)),
        ("aws-access-key-id", "AKIA" + _r(rng, UPPER, 16)),
        ("github-token", "ghp_" + _r(rng, ALNUM, 36)),
        ("github-token", "github_pat_" + _r(rng, ALNUM, 22) + "_" + _r(rng, ALNUM, 59)),
        ("slack-token", "xoxb-" + _r(rng, string.digits, 12) + "-" + _r(rng, ALNUM, 24)),
        ("stripe-key", "sk_live_" + _r(rng, ALNUM, 24)),
        ("huggingface-token", "hf_" + _r(rng, ALNUM, 34)),
        ("jwt", jwt),
    ]
    out = [(kind, value, value) for kind, value in rows]
    out += [
        ("private-key", pem, pem),
        ("aws-secret-access-key", aws_secret, f"aws_secret_access_key = {aws_secret}"),
        ("bearer-token", bearer, f"Authorization: Bearer {bearer}"),
        ("url-password", url_pw, f"postgres://admin:{url_pw}@db.internal:5432/app"),
        ("password", pw, f'DB_PASSWORD="{pw}"'),
    ]
    return out


def embed(kind: str, written: str, i: int) -> str:
    """The secret's text inside prose, a code block, JSON or a URL, by turn."""
    forms = [
        f"Here is my {kind} so you can help: {written} — why does it fail?",
        f"```python\nclient = make_client()\nconfig = '''\n{written}\n'''\n```\nAny idea?",
        json.dumps({"service": kind, "credentials": written, "retries": 3}, indent=2),
        f"I open https://example.test/setup?x=1 then paste {written} into the form.",
    ]
    return forms[i % len(forms)]


def lookalikes(seed: int = 11) -> list[str]:
    """Text that is not secret but looks like it to a careless scanner."""
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(40):
        sha = hashlib.sha1(_r(rng, ALNUM, 20).encode()).hexdigest()
        out.append(f"commit {sha}\nAuthor: Dev <dev@example.test>\n\n    fix the parser")
        out.append(f"git log --oneline: {sha[:7]} merge branch; full {sha}")
    for _ in range(40):
        out.append(f"request id {uuid.UUID(int=rng.getrandbits(128))} failed with 502")
    words = [
        "Pneumonoultramicroscopicsilicovolcanoconiosis is a long word.",
        "internationalization and responsibilities are antidisestablishmentarianism's kin",
        "The tokenizer splits text; the password field stays empty until typed.",
        "a secret of good cooking is patience, says the token ring documentation",
    ]
    out += words * 5
    png = base64.b64encode(bytes(rng.getrandbits(8) for _ in range(60))).decode()
    out += [f"![chart](data:image/png;base64,{png})", f"[image: summarised] {png[:40]}"] * 5
    code = [
        "password = input('Password: ')\nif not password:\n    raise ValueError('empty')",
        "def check(password: str) -> bool:\n    return bcrypt.verify(password, self.password_hash)",
        "token = request.headers.get('X-Token')\nsecret = os.environ['APP_SECRET']",
        'api_key = settings.api_key  # read from the vault\npassword: "${DB_PASSWORD}"',
        "postgres://user:password@localhost/db is the example in the docs",
        "Set PASSWORD=changeme for local tests; the token is passed as Bearer $TOKEN.",
        "sk-learn is often misspelled; AKIA is a prefix; eyJ starts base64 of '{\"'.",
        "The key: value pairs in the YAML file are keyed by secret_name: db-main-credentials",
    ]
    out += code * 5
    return out
