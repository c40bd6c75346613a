"""Retrieval quality of recall on a multi-session conversation set: hybrid vs BM25 vs dense.

    .venv/bin/python bench/quality.py               # everything, layout variants included
    .venv/bin/python bench/quality.py --no-variants # only what memd serves

The conversation set is generated here, deterministically: 36 sessions spread over twelve
weeks, each with two or three conversations (trips, parties, visits, pets, bugs, design
decisions, how-tos, stand-alone personal facts) and some small talk. Follow-ups lean on
their opener ("which part of town should we stay in?"), so many answers sit in an
exchange that lacks the word the later question uses (the city); a small cast of people
recurs across conversations. Every fact sits in exactly one exchange and has one or two
questions as a user would ask them weeks later. Sessions are recorded through memd's
socket in order, with `timestamp`, and closed with `sessions.close`, so each is its own
file; memd's watcher indexes them.

For each question the bench asks for the top 5 and the top 10 sections and reports
recall@1/@5/@10 of the evidence exchange (found when a returned section holds its
`**User:**` line) and the mean characters of the text at top 5, for:

- hybrid: `memory.recall`, exactly what memd serves (dense + BM25, RRF);
- BM25 alone and dense alone: the same index, one pymilvus request on the client's index
  socket, with memd's own expand/dedupe/label code (`memd.recall.expand.collect`, `render`).

With variants (the default) it also copies the transcripts, rewritten in other layouts,
into extra clients and measures them the same way (see `VARIANTS`).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from _daemon import (
    Connections,
    IndexView,
    lost_watch_events,
    machine,
    record_burst,
    running_daemon,
    wait_indexed,
    wait_searchable,
)

from memd import recall as rc
from memd.indexing import embedding
from memd.indexing.query.search import OUTPUT_FIELDS, Hit, exchange_time
from memd.layout import ClientLayout
from memd.markdown.transcript import HEADING_TIME, parse_exchange_heading
from tests.support.daemon import base_config, write_config

EMBEDDER = embedding.Embedder()  # one model for the whole run

CLIENT = "quality"
SEED = 11

# -- the conversation set -----------------------------------------------------------------
#
# Conversations, not loose facts: an opener names the topic and follow-ups ("where should
# we stay?") rely on it, as people write. Many facts sit in a follow-up whose own text
# lacks the topic word the question uses; the same people come up in several
# conversations. Every fact exchange carries the questions whose answer it holds.

PEOPLE = [
    "Lena",
    "Marco",
    "Priya",
    "Tomasz",
    "Aiko",
    "Bongani",
    "Clara",
    "Diego",
    "Elif",
    "Finn",
    "Gosia",
    "Hamid",
    "Ingrid",
    "Jamal",
]
RELATIONS = [
    "sister",
    "brother",
    "cousin",
    "colleague",
    "neighbour",
    "best friend",
    "aunt",
    "uncle",
    "flatmate",
    "godson",
    "niece",
    "nephew",
    "mother-in-law",
    "old friend",
]
DATES = [
    "3 January",
    "19 February",
    "7 March",
    "28 April",
    "11 May",
    "2 June",
    "23 July",
    "15 August",
    "9 September",
    "30 October",
    "4 November",
    "17 December",
]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]

# (place, district, why, getting around, dish, where to eat it)
TRIPS = [
    (
        "Lisbon",
        "Alfama",
        "it is walkable and full of small family restaurants",
        "Buy a Viva Viagem card: tram 28 and the metro reach most sights",
        "pastéis de nata",
        "Manteigaria in Chiado",
    ),
    (
        "Kyoto",
        "Higashiyama",
        "the old temples are on your doorstep",
        "Get a one-day bus pass and walk between the temples",
        "kaiseki",
        "a ryokan dinner",
    ),
    (
        "Tromsø",
        "the centre near Storgata",
        "the aurora tours pick you up there",
        "Use the local buses and the airport express coach",
        "bacalao stew",
        "Mathallen",
    ),
    (
        "Marrakesh",
        "a riad inside the medina",
        "you can walk to the souks",
        "Walk, and agree taxi fares before you get in",
        "tagine with preserved lemon",
        "the Jemaa el-Fnaa food stalls",
    ),
    (
        "Ljubljana",
        "the old town by the river",
        "everything is a 15-minute walk away",
        "Rent bikes from the BicikeLJ stations",
        "štruklji",
        "the Friday Open Kitchen market",
    ),
    (
        "Oaxaca",
        "Jalatlaco",
        "it is quiet but close to the zócalo",
        "Walk in town and take colectivo taxis to the villages",
        "mole negro",
        "Mercado 20 de Noviembre",
    ),
    (
        "Tbilisi",
        "Sololaki",
        "the old houses are beautiful and the baths are close",
        "The metro is cheap, and Bolt taxis cover the rest",
        "khachapuri",
        "Café Littera",
    ),
    (
        "Hobart",
        "Battery Point",
        "it is historic and next to Salamanca Market",
        "Take the MONA ferry, and hire a car for day trips",
        "scallop pies",
        "Salamanca Market on Saturday",
    ),
]
# (event, how a user would call it later, venue, gift, hobby)
PARTIES = [
    (
        "surprise 40th birthday party",
        "surprise party",
        "the back room of the Crown & Anchor",
        "a voucher for a pottery course",
        "ceramics",
    ),
    (
        "retirement dinner",
        "leaving do",
        "Trattoria Lucca on Hill Street",
        "a good pair of binoculars",
        "bird watching",
    ),
    (
        "baby shower",
        "baby party",
        "the community hall on Elm Road",
        "a sling and a set of muslins",
        "long walks",
    ),
    (
        "engagement drinks",
        "engagement celebration",
        "the rooftop bar at the Marlowe",
        "a framed map of where they met",
        "old maps",
    ),
    ("book launch", "book event", "the café at Foyle's", "a fountain pen", "calligraphy"),
    (
        "housewarming",
        "new-flat party",
        "their new place on Canal Street",
        "a big potted olive tree",
        "gardening",
    ),
]
# (project, error, what the user calls it, cause and fix, library, pinned version)
BUGS = [
    (
        "Heron",
        "ModuleNotFoundError: No module named 'yaml'",
        "the yaml import error",
        "The package is called PyYAML: `pip install pyyaml` in the same virtualenv.",
        "PyYAML",
        "6.0.1",
    ),
    (
        "Atlas",
        "x509: certificate signed by unknown authority",
        "the certificate trust error",
        "The container image has no CA bundle: install ca-certificates in the Dockerfile.",
        "the base image",
        "debian:12.5-slim",
    ),
    (
        "Juniper",
        "database is locked",
        "the SQLite locking error",
        "Two writers at once: enable WAL mode and set busy_timeout to 5000 ms.",
        "sqlite",
        "3.45",
    ),
    (
        "Kestrel",
        "EADDRINUSE: address already in use :::3000",
        "the port clash",
        "An old node process still holds port 3000: kill it, or start with PORT=3001.",
        "node",
        "20.11 LTS",
    ),
    (
        "Mosaic",
        "OOMKilled",
        "the pods being killed for memory",
        "The pod hits its memory limit: raise resources.limits.memory to 1Gi and fix the cache "
        "that never evicts.",
        "the Helm chart",
        "4.2.0",
    ),
    (
        "Osprey",
        "fatal: refusing to merge unrelated histories",
        "the git merge refusal",
        "The two branches share no commit: pull once with --allow-unrelated-histories.",
        "git",
        "2.43",
    ),
]
# (project, topic, requirements, choice, why)
DECISIONS = [
    (
        "Heron",
        "database",
        "transactions across invoices and about 50 GB of data",
        "PostgreSQL with pgbouncer",
        "it gives you real transactions and pooling",
    ),
    (
        "Atlas",
        "message queue",
        "small volumes, and the team already runs Redis",
        "Redis streams",
        "no new system to operate",
    ),
    (
        "Juniper",
        "storage",
        "it has to work offline on every device",
        "SQLite on each device with a sync job",
        "offline first is the hard requirement",
    ),
    (
        "Kestrel",
        "programming language",
        "one static binary per platform and fast start-up",
        "Go",
        "cross-compiling static binaries is trivial",
    ),
    (
        "Mosaic",
        "frontend framework",
        "a bundle under 50 kB and a small team",
        "Svelte",
        "it compiles away and the bundles stay tiny",
    ),
    (
        "Tundra",
        "release schedule",
        "support is fully staffed only on Tuesdays",
        "weekly releases on Tuesday mornings",
        "problems get fixed while everyone is in",
    ),
    (
        "Osprey",
        "log archive",
        "logs must be kept for seven years at low cost",
        "S3 with a lifecycle rule to Glacier after 90 days",
        "it is the cheapest durable option",
    ),
    (
        "Quill",
        "CI system",
        "macOS runners and we already pay for GitHub",
        "GitHub Actions",
        "the macOS runners are included",
    ),
]
# (question, answer, paraphrase, paraphrase, what the task is called, the macOS answer or "")
TECH = [
    (
        "How can I see which process is listening on port 8080 on Linux?",
        "Run `ss -ltnp 'sport = :8080'` (or `lsof -i :8080`); the last column shows the PID.",
        "what was the command to find what's using a port",
        "something is already bound to 8080, how do I find it",
        "find what is using a port",
        "On macOS use `lsof -nP -iTCP:8080 -sTCP:LISTEN`; there is no ss.",
    ),
    (
        "How do I undo my last git commit but keep the changes?",
        "`git reset --soft HEAD~1` moves the branch back one commit and leaves the changes staged.",
        "take back a commit without losing my edits",
        "revert the latest commit softly",
        "",
        "",
    ),
    (
        "In Python, how do I read a huge CSV without loading it all into memory?",
        "Iterate with `csv.reader` over the open file, or use pandas "
        "`read_csv(path, chunksize=100_000)` and process one chunk at a time.",
        "processing a massive spreadsheet export piece by piece in python",
        "pandas chunksize trick",
        "",
        "",
    ),
    (
        "How do I make a systemd service restart automatically when it crashes?",
        "Add `Restart=on-failure` and `RestartSec=5` to the [Service] section, then "
        "`systemctl daemon-reload`.",
        "automatic restart of a crashed unit",
        "keep a daemon alive after it dies",
        "restart a crashed service",
        "macOS has launchd instead: set `KeepAlive` to true in the LaunchAgent plist.",
    ),
    (
        "What's the PostgreSQL way to find slow queries?",
        "Enable the `pg_stat_statements` extension and sort by `mean_exec_time`; also set "
        "`log_min_duration_statement = 500ms`.",
        "how to find which database statements are slow",
        "postgres extension for query stats",
        "",
        "",
    ),
    (
        "How do I limit a Docker container's memory?",
        "`docker run --memory=512m --memory-swap=512m ...`; in compose use `mem_limit`.",
        "cap the RAM a container can use",
        "stop a container from eating all memory",
        "limit container memory",
        "With Docker Desktop on macOS also raise the VM's memory in Settings > Resources.",
    ),
    (
        "How can I grow an ext4 filesystem after enlarging the disk?",
        "`growpart /dev/sda 1` then `resize2fs /dev/sda1`; both work while it is mounted.",
        "the virtual disk got bigger, how do I use the extra space",
        "resize partition and filesystem online",
        "",
        "",
    ),
    (
        "How do I generate an SSH key that uses ed25519?",
        "`ssh-keygen -t ed25519 -C you@example.com`, then copy the public half with "
        "`ssh-copy-id host`.",
        "creating a new ssh key pair",
        "make a modern key for ssh logins",
        "set up an ssh key",
        "Same command on macOS; add `--apple-use-keychain` to ssh-add to keep the passphrase.",
    ),
    (
        "How do I run a cron job every 15 minutes?",
        "Put `*/15 * * * * /path/to/script.sh` in `crontab -e`.",
        "schedule something four times an hour",
        "crontab syntax for a quarter-hourly task",
        "schedule a job every 15 minutes",
        "On macOS prefer launchd with `StartInterval` 900; cron needs Full Disk Access.",
    ),
    (
        "How do I find what's filling up my disk from the terminal?",
        "`du -ah / | sort -rh | head -20`, or `ncdu /` for an interactive view.",
        "what is eating my disk space",
        "list the biggest files and folders",
        "find what fills the disk",
        "On macOS `du -sh ~/* | sort -h`, or the Storage pane in System Settings.",
    ),
    (
        "How do I set a timeout on HTTP requests in Python?",
        "`requests.get(url, timeout=(3.05, 27))` sets connect and read timeouts; without one a "
        "request can hang forever.",
        "web call in python hangs forever, how to bound it",
        "requests library time limit",
        "",
        "",
    ),
    (
        "My Kubernetes pod is stuck in CrashLoopBackOff, how do I see why?",
        "`kubectl logs <pod> --previous` shows the last crash's output; `kubectl describe pod` "
        "shows exit codes and events.",
        "a container keeps restarting in k8s, where do I look",
        "debugging a crash-looping pod",
        "",
        "",
    ),
    (
        "How can I shrink a video to a smaller mp4 with ffmpeg?",
        "`ffmpeg -i in.mov -c:v libx264 -crf 26 -preset slow -c:a aac out.mp4`; a higher crf "
        "gives smaller files.",
        "compress a movie file",
        "make a clip smaller without much loss",
        "shrink a video",
        "On a Mac, `-c:v h264_videotoolbox -b:v 2M` uses the hardware encoder.",
    ),
    (
        "How do I make a Bash script stop at the first failing command?",
        "Start it with `set -euo pipefail`: -e exits on errors, -u on unset variables, pipefail "
        "catches failures inside pipes.",
        "make a shell script abort when something fails",
        "strict mode for bash",
        "",
        "",
    ),
    (
        "How do I check a TLS certificate's expiry date from the command line?",
        "`openssl s_client -connect host:443 -servername host </dev/null | openssl x509 -noout "
        "-enddate`.",
        "when does the site's https cert run out",
        "openssl expiry check",
        "",
        "",
    ),
]
# (relation, diet, what to avoid, dish, day out)
VISITS = [
    (
        "allergic to peanuts",
        "satay and peanut sauces",
        "Thai green curry without nuts",
        "the botanical gardens and the glasshouses",
    ),
    (
        "vegan",
        "meat, dairy and eggs",
        "chickpea and spinach stew",
        "the coastal path from the harbour to the lighthouse",
    ),
    (
        "coeliac",
        "wheat, barley and rye",
        "mushroom risotto",
        "the steam railway and its little museum",
    ),
    (
        "lactose intolerant",
        "cream and soft cheese",
        "tomato and olive pasta",
        "the modern art gallery by the river",
    ),
    (
        "allergic to shellfish",
        "prawns, mussels and crab",
        "lemon roast chicken",
        "a boat trip round the islands",
    ),
    ("pescatarian", "meat", "miso-glazed salmon", "the Saturday farmers' market"),
]
# (animal, name, feeding, first vet visit)
PETS = [
    (
        "puppy",
        "Biscuit",
        "Three small meals a day until six months, then two; fresh water always out.",
        "vaccinations at eight weeks",
    ),
    (
        "kitten",
        "Pixel",
        "Four small portions of wet food a day, spread out.",
        "a health check and worming",
    ),
    (
        "rabbit",
        "Clover",
        "Unlimited hay, a handful of greens morning and evening, pellets only as a treat.",
        "vaccination against myxomatosis",
    ),
    (
        "parrot",
        "Captain",
        "Pellets as the base, fresh vegetables daily, seeds only as a treat.",
        "a beak and feather check",
    ),
    (
        "tortoise",
        "Speedy",
        "Weeds and leafy greens every day, no fruit, a cuttlefish bone for calcium.",
        "a weight check before hibernation",
    ),
]
# (item, where, how a user would ask about it)
ITEMS = [
    ("spare car key", "blue tin on top of the fridge", "the extra key for the car"),
    ("passport", "locked drawer of the desk in the study", "my travel document"),
    (
        "warranty for the washing machine",
        "red folder in the hallway cupboard",
        "the guarantee papers for the washer",
    ),
    ("winter tyres", "left corner of the garage behind the bikes", "the snow tyres for the car"),
    ("camping tent", "loft, next to the Christmas decorations", "our tent"),
    ("emergency cash", "envelope taped inside the wardrobe", "the rainy-day money"),
]
# (thing, value, how a user would ask)
NUMBERS = [
    ("bike lock code", "4-7-1-9", "the combination for my bicycle lock"),
    ("gym locker number", "218", "which locker I use at the gym"),
    ("car registration", "KX71 ZPD", "my car's number plate"),
    ("library card number", "0045 9981 2230", "my library membership number"),
    ("storage unit", "B-113 at SafeStore on Mill Road", "which storage unit is ours"),
]
# (kind, doctor, date, time, how a user would ask, what to bring)
APPOINTMENTS = [
    (
        "dentist",
        "Okafor",
        "12 March",
        "9:40",
        "my teeth check-up",
        "your list of medicines and the referral letter",
    ),
    (
        "physiotherapy",
        "Lindqvist",
        "5 April",
        "16:15",
        "the physio session",
        "shorts and the scan of your knee",
    ),
    (
        "eye test",
        "Moreau",
        "21 May",
        "11:00",
        "getting my eyes checked",
        "your current glasses, and don't drive: the drops blur your sight",
    ),
    (
        "dermatology",
        "Haddad",
        "8 June",
        "14:30",
        "the skin doctor",
        "photos of how the patch looked last month",
    ),
    (
        "hearing test",
        "Ivanova",
        "14 August",
        "10:20",
        "the audiology appointment",
        "nothing special, but avoid loud music the day before",
    ),
]
# (category, favourite, how a user would ask)
FAVOURITES = [
    ("film", "Spirited Away", "which movie I love most"),
    ("board game", "Wingspan", "the tabletop game I like best"),
    ("hiking trail", "the Pennine Way", "my favourite walk"),
    ("band", "Khruangbin", "the group I listen to most"),
    ("coffee order", "a flat white with oat milk", "how I take my coffee"),
]
# (goal, how a user would ask)
GOALS = [
    ("run a half marathon", "the 21 km race"),
    ("read twenty books", "my reading challenge"),
    ("learn conversational Spanish", "speaking Spanish"),
    ("pay off the credit card", "clearing my card debt"),
    ("finish the garden shed", "building the shed"),
]
SMALL_TALK = [
    (
        "Any tips for falling asleep faster?",
        "Keep a fixed wake-up time, dim the lights an hour "
        "before bed, and keep the phone out of the bedroom.",
    ),
    ("Tell me a fun fact about octopuses.", "An octopus has three hearts and blue blood."),
    (
        "Summarise Hamlet in two lines.",
        "A Danish prince learns his uncle killed his father, "
        "hesitates over revenge, and nearly everyone dies.",
    ),
    (
        "Recommend a podcast about history.",
        "Try 'The Rest Is History': two historians, relaxed and well researched.",
    ),
    (
        "What's a good stretch after sitting all day?",
        "A standing hip-flexor lunge, thirty seconds each side, and a doorway chest stretch.",
    ),
    (
        "How long should I boil an egg for a runny yolk?",
        "Six minutes from boiling water, then straight into cold water.",
    ),
    (
        "Is it worth learning to touch type?",
        "Yes: a few weeks of fifteen minutes a day pays back for the rest of your working life.",
    ),
    (
        "What's the difference between weather and climate?",
        "Weather is what happens this week; climate is the pattern over decades.",
    ),
    (
        "How do I keep basil alive on a windowsill?",
        "Water it when the top of the soil is dry, "
        "pinch off flower buds, and give it the sunniest window.",
    ),
    (
        "Why is the sky blue?",
        "Air scatters short blue wavelengths of sunlight more than red ones (Rayleigh scattering).",
    ),
    (
        "Write a haiku about Mondays.",
        "Alarm sings too soon / coffee steams against the grey / the week stretches out.",
    ),
    (
        "How do I clean a cast iron pan?",
        "Hot water and a brush, no soaking, dry it on the hob and wipe on a thin film of oil.",
    ),
    (
        "Can you suggest a quick weekday dinner?",
        "A tray bake: sausages or chickpeas, peppers, "
        "red onion and potatoes, 35 minutes at 200 °C.",
    ),
    (
        "What should I read next if I liked Project Hail Mary?",
        "Try 'The Martian' by the same author, or 'Children of Time' by Adrian Tchaikovsky.",
    ),
]
FILLER = [
    "Let me know if you want more detail on any of this.",
    "It is worth writing this down somewhere you will find it again.",
    "There are other ways to do it, but this one is the least surprising.",
    "If anything changes, tell me and I will adjust the plan.",
    "Most people find the second time much easier than the first.",
]


@dataclass
class Exchange:
    user: str
    assistant: str
    questions: list[str] = field(default_factory=list)
    timestamp: str = ""
    session: int = 0

    @property
    def key(self) -> str:
        """What identifies this exchange in a returned section (follow-ups repeat questions)."""
        return f"**User:** {self.user}\n\n**Assistant:** {self.assistant[:50]}"


Conversation = list[Exchange]


def _x(user: str, assistant: str, *questions: str) -> Exchange:
    return Exchange(user, assistant, list(questions))


def conversations(rng: random.Random) -> list[Conversation]:
    """Every conversation of the set; facts keyed to people reuse a small cast."""
    people = [(name, rng.choice(RELATIONS)) for name in PEOPLE]
    cast = iter(rng.sample(people * 3, len(people) * 3))
    out: list[Conversation] = []
    for place, district, why, transport, dish, eat in TRIPS:
        (name, _), month, days = next(cast), rng.choice(MONTHS), rng.randint(3, 9)
        conv = [
            _x(
                f"I'm planning {days} days in {place} in {month} with {name}.",
                f"{place} in {month} is a lovely idea. Shall I help with where to stay?",
                f"Who is coming with me to {place}?",
                f"When is the {place} trip, and how long?",
            ),
            _x(
                "Yes please, which part of town should we stay in?",
                f"Stay in {district}: {why}.",
                f"Which area did you recommend staying in for {place}?",
                f"where were we going to base ourselves on the {place} holiday",
            ),
            _x(
                "How do we get around once we're there?",
                f"{transport}.",
                f"What's the best way to get around {place}?",
                f"public transport tips for {place}",
            ),
        ]
        if rng.random() < 0.6:
            conv.append(
                _x(
                    "And one thing we really must eat?",
                    f"{dish.capitalize()}; the best are at {eat}.",
                    f"What food should we try in {place}?",
                    f"where did you say to eat in {place}",
                )
            )
        out.append(conv)
    for event, called, venue, gift, hobby in PARTIES:
        (name, rel), date = next(cast), rng.choice(DATES)
        out.append(
            [
                _x(
                    f"I'm organising a {event} for my {rel} {name}.",
                    "How exciting! When and where will it be?",
                    f"Who am I throwing a {called} for?",
                ),
                _x(
                    f"It's on {date} at {venue}, with about {rng.randint(12, 40)} guests.",
                    f"Then book {venue} for {date} now and send the invitations three weeks ahead.",
                    f"Where is {name}'s {called} going to be?",
                    f"What date is the {called}?",
                ),
                _x(
                    "Any ideas for a present?",
                    f"{gift.capitalize()}: perfect, since {name} loves {hobby}.",
                    f"What gift did you suggest for {name}?",
                    f"present idea for the {called}",
                ),
            ]
        )
    for project, error, called, fix, lib, version in BUGS:
        out.append(
            [
                _x(
                    f"On {project} I keep getting `{error}`. What's going on?",
                    fix,
                    f"How did we fix {called} on {project}?",
                    f"What was causing {called}?",
                ),
                _x(
                    "That fixed it. What should we pin so it doesn't come back?",
                    f"Pin {lib} to {version} and add a CI check that fails on drift.",
                    f"Which {lib} version did we pin for {project}?",
                ),
            ]
        )
    for project, topic, needs, choice, why in DECISIONS:
        out.append(
            [
                _x(f"Let's settle the {topic} for {project}.", "Sure. What are the requirements?"),
                _x(
                    f"We need {needs}.",
                    f"Then go with {choice}: {why}.",
                    f"What {topic} did we choose for {project}?",
                    f"Why did we go with {choice.split(' with ')[0]}?",
                ),
            ]
        )
    for question, answer, q1, q2, task, mac in TECH:
        conv = [_x(question, answer, q1, q2)]
        if mac:
            conv.append(_x("And on my Mac?", mac, f"How do I {task} on macOS?"))
        out.append(conv)
    for diet, avoid, dish, day_out in VISITS:
        (name, rel), month, date = next(cast), rng.choice(MONTHS), rng.choice(DATES)
        out.append(
            [
                _x(
                    f"My {rel} {name} is staying with us for a week in {month}.",
                    "Lovely! Anything I should plan around?",
                    f"When is {name} coming to stay?",
                ),
                _x(
                    f"They're {diet}, and their birthday is on {date} while they're here.",
                    f"Then avoid {avoid}; for the birthday dinner, {dish} would work.",
                    f"What can't {name} eat?",
                    f"When is {name}'s birthday?",
                ),
                _x(
                    "Ideas for a day out together?",
                    f"Take them to {day_out}.",
                    f"Where did you suggest taking {name} for a day out?",
                ),
            ]
        )
    for animal, pet, feeding, vet in PETS:
        out.append(
            [
                _x(
                    f"We adopted a {animal} from the shelter and called it {pet}!",
                    f"Congratulations, {pet} is a great name. The first days are about calm and "
                    "routine.",
                    f"What did we name the {animal}?",
                ),
                _x(
                    "How often should we feed it?",
                    feeding,
                    f"How often should {pet} be fed?",
                    f"feeding schedule for our {animal}",
                ),
                _x(
                    "What happens at the first vet visit?",
                    f"Expect {vet}.",
                    f"What is {pet}'s first vet appointment for?",
                ),
            ]
        )
    for item, where, asked in ITEMS:
        out.append(
            [
                _x(
                    f"I've put the {item} in the {where}, so I don't lose it again.",
                    f"Got it: {item} in the {where}.",
                    f"Where did I stash {asked}?",
                    f"I can't find {asked}, where did I say it was?",
                )
            ]
        )
    for thing, value, asked in NUMBERS:
        out.append(
            [
                _x(
                    f"For the record, my {thing} is {value}.",
                    f"Noted: your {thing} is {value}.",
                    f"What's {asked}?",
                    f"Remind me of {asked}.",
                )
            ]
        )
    for kind, doctor, date, hour, asked, bring in APPOINTMENTS:
        out.append(
            [
                _x(
                    f"I've booked a {kind} appointment with Dr {doctor} on {date} at {hour}.",
                    f"OK: {kind} with Dr {doctor}, {date} at {hour}.",
                    f"When am I seeing Dr {doctor}?",
                    f"What time is {asked}?",
                ),
                _x(
                    "Do I need to bring anything?",
                    f"Bring {bring}.",
                    f"What do I need to take to {asked}?",
                ),
            ]
        )
    for category, value, asked in FAVOURITES:
        out.append(
            [
                _x(
                    f"Random fact about me: my favourite {category} is {value}.",
                    f"{value} is a great choice!",
                    f"What's {asked}?",
                    f"Do you remember my favourite {category}?",
                )
            ]
        )
    for goal, asked in GOALS:
        month = rng.choice(MONTHS)
        out.append(
            [
                _x(
                    f"My plan is to {goal} by the end of {month}.",
                    f"Good goal. Break it into weekly steps and check in with me before {month}.",
                    f"What deadline did I set for {asked}?",
                    f"By when did I want to {goal}?",
                )
            ]
        )
    return out


def make_set(rng: random.Random, sessions: int, start: datetime) -> list[list[Conversation]]:
    """Conversations shuffled into sessions with small talk; some answers get padding."""
    convs = conversations(rng)
    rng.shuffle(convs)
    plan: list[list[Conversation]] = [[] for _ in range(sessions)]
    for i, conv in enumerate(convs):
        plan[i % sessions].append(conv)
    out = []
    for s, convs_of_session in enumerate(plan):
        for _ in range(rng.randint(1, 2)):
            user, answer = rng.choice(SMALL_TALK)
            convs_of_session.insert(
                rng.randrange(len(convs_of_session) + 1), [Exchange(user, answer)]
            )
        first = start + timedelta(days=84 * s / sessions, hours=rng.randint(7, 21))
        exchanges = [ex for conv in convs_of_session for ex in conv]
        for j, ex in enumerate(exchanges):
            ex.session = s
            ex.timestamp = (
                first + timedelta(minutes=3 * j, seconds=rng.randint(0, 59))
            ).isoformat()
            if rng.random() < 0.4:
                ex.assistant += "\n\n" + " ".join(rng.sample(FILLER, 3))
        out.append(convs_of_session)
    return out


# -- transcript layouts (rewrites of the files memd wrote) ---------------------------------

_USER = "**User:** "


@dataclass(frozen=True)
class Heading:
    """An exchange heading as memd writes it: `## <time> · exchange K[ · note] — <title>`."""

    line: str
    time: str
    number: int
    note: str
    title: str

    @property
    def bare(self) -> str:
        """The heading without the conversation title (memd's layout before titles)."""
        return f"## {self.time} · exchange {self.number}" + (f" · {self.note}" if self.note else "")


def _heading(line: str) -> Heading | None:
    parsed = parse_exchange_heading(line[3:]) if line.startswith("## ") else None
    if parsed is None:
        return None
    when, number, note, title = parsed
    return Heading(line, when.strftime(HEADING_TIME), number, note, title)


def _rewrite(text: str, heading: Callable[[Heading, Context], str], front: bool = True) -> str:
    """Rewrite each exchange heading with heading(match, context)."""
    lines = text.split("\n")
    if not front and lines and lines[0] == "---":
        end = lines.index("---", 1)
        lines = lines[end + 1 :]
        while lines and not lines[0]:
            lines.pop(0)
    title = previous = ""
    for i, line in enumerate(lines):
        if line.startswith("# Conversation "):
            title = previous = ""
        m = _heading(line)
        if m is None:
            continue
        question = next((x[len(_USER) :] for x in lines[i + 1 : i + 4] if x.startswith(_USER)), "")
        title = title or question
        lines[i] = heading(m, Context(_short(title), _short(question), _short(previous)))
        previous = question
    return "\n".join(lines)


@dataclass(frozen=True)
class Context:
    """What a rewritten heading may draw on: the conversation's first question (its title),
    the exchange's own question, and the question before it in the conversation."""

    title: str
    question: str
    previous: str


def _short(text: str, n: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n].rsplit(" ", 1)[0] + "…"


VARIANTS: dict[str, tuple[str, Callable[[str], str]]] = {
    "copy": ("memd's layout, copied (control)", lambda t: t),
    "nofront": ("no YAML front matter", lambda t: _rewrite(t, lambda m, c: m.line, False)),
    "notitle": (
        "no conversation title in the heading (memd's layout before titles)",
        lambda t: _rewrite(t, lambda m, c: m.bare),
    ),
    "nodate": (
        "no date in the heading (`## Exchange N — title`)",
        lambda t: _rewrite(t, lambda m, c: f"## Exchange {m.number} — {m.title}"),
    ),
    "question": (
        "the exchange's own question instead of the title",
        lambda t: _rewrite(t, lambda m, c: f"{m.bare} — {c.question}"),
    ),
    "previous": (
        "the conversation's previous question instead of the title",
        lambda t: _rewrite(t, lambda m, c: f"{m.bare} — {c.previous}" if c.previous else m.bare),
    ),
    "title-question": (
        "the title and the exchange's own question",
        lambda t: _rewrite(t, lambda m, c: f"{m.line} · {c.question}"),
    ),
}


# -- measuring ------------------------------------------------------------------------------


@dataclass
class Score:
    label: str
    ranks: list[int | None] = field(default_factory=list)  # rank in top 5 (None: missed)
    ranks10: list[int | None] = field(default_factory=list)
    chars: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # opener | follow-up

    def row(self) -> str:
        n = len(self.ranks)

        def at(k: int, ranks: Sequence[int | None]) -> str:
            return f"{100 * sum(r is not None and r < k for r in ranks) / max(1, len(ranks)):.0f}%"

        by_kind = [
            at(5, [r for r, kind in zip(self.ranks, self.kinds, strict=True) if kind == wanted])
            for wanted in ("opener", "follow-up")
        ]
        return (
            f"| {self.label} | {n} | {at(1, self.ranks)} | {at(5, self.ranks)} | "
            f"{at(10, self.ranks10)} | {by_kind[0]} | {by_kind[1]} | "
            f"{sum(self.chars) / n:,.0f} |"
        )


class Question(NamedTuple):
    text: str
    key: str  # the evidence exchange's `Exchange.key`
    kind: str  # opener (first exchange of its conversation) | follow-up


def _rank(sections: Sequence[dict[str, Any]], key: str) -> int | None:
    return next((i for i, s in enumerate(sections) if key in s["content"]), None)


class Searcher:
    """One client's index: memd's hybrid over the socket, BM25 or dense over pymilvus."""

    def __init__(self, conns: Connections, view: IndexView, layout: ClientLayout) -> None:
        self.conns = conns
        self.view = view
        self.layout = layout
        self.client = view.client()
        self.client_id = layout.client_id

    def hybrid(self, query: str, top_k: int) -> dict[str, Any]:
        return self.conns.call(
            "memory.recall", {"client_id": self.client_id, "query": query, "top_k": top_k}
        )

    def single(self, query: str, top_k: int, mode: str) -> dict[str, Any]:
        """One request (BM25 or dense), then memd's own collect + render."""
        if mode == "bm25":
            data: Any = [query]
            field_, params = "sparse_vector", {"metric_type": "BM25"}
        else:
            data = [EMBEDDER.embed_one(query)]
            field_, params = "embedding", {"metric_type": "COSINE"}
        rows = self.client.search(
            collection_name=self.view.collection,
            data=data,
            anns_field=field_,
            search_params=params,
            limit=top_k * rc.OVERFETCH + 1,
            output_fields=OUTPUT_FIELDS,
        )
        top = max((r["distance"] for r in rows[0]), default=1.0) or 1.0
        hits = [_hit(r["entity"], r["distance"] / top) for r in rows[0]]
        return rc.render(rc.collect(hits, self.layout, top_k))

    def score(self, label: str, questions: Sequence[Question], mode: str) -> Score:
        out = Score(label)
        for question, key, kind in questions:
            out.kinds.append(kind)
            for top_k, ranks in ((5, out.ranks), (10, out.ranks10)):
                found = (
                    self.hybrid(question, top_k)
                    if mode == "hybrid"
                    else self.single(question, top_k, mode)
                )
                ranks.append(_rank(found["results"], key))
                if top_k == 5:
                    out.chars.append(len(found["text"]))
        return out

    def close(self) -> None:
        self.client.close()


def _hit(row: dict[str, Any], score: float) -> Hit:
    heading = row.get("heading") or ""
    return Hit(
        chunk_hash=row["chunk_hash"],
        source=row["source"],
        heading=heading,
        heading_level=int(row.get("heading_level") or 0),
        content=row.get("content") or "",
        score=score,
        start_line=int(row.get("start_line") or 0),
        end_line=int(row.get("end_line") or 0),
        when=exchange_time(heading),
    )


def table(title: str, scores: Sequence[Score]) -> None:
    print()
    print(title)
    print()
    print(
        "| search | questions | recall@1 | recall@5 | recall@10 | @5 opener | @5 follow-up "
        "| mean chars (top 5) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for s in scores:
        print(s.row())


# -- main ---------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=36)
    ap.add_argument("--no-variants", action="store_true", help="skip the layout variants")
    ap.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="extra memd config (top-level key = JSON value), e.g. "
        "'recall={\"min_score\": 0}'; may be repeated",
    )
    args = ap.parse_args()
    extra = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.config)}
    rng = random.Random(SEED)
    start = datetime(2026, 6, 1, tzinfo=UTC)
    plan = make_set(rng, args.sessions, start)
    exchanges = [ex for session in plan for conv in session for ex in conv]
    questions = [
        Question(q, ex.key, "follow-up" if i else "opener")
        for session in plan
        for conv in session
        for i, ex in enumerate(conv)
        for q in ex.questions
    ]
    print(machine())
    talk = sum(not any(ex.questions for ex in conv) for s in plan for conv in s)
    print(
        f"{len(plan)} sessions, {sum(len(s) for s in plan) - talk} conversations and "
        f"{talk} small-talk exchanges, "
        f"{len(exchanges)} exchanges, {sum(bool(ex.questions) for ex in exchanges)} with "
        f"facts, {len(questions)} questions "
        f"({sum(q.kind == 'opener' for q in questions)} about an opener or stand-alone "
        f"exchange, {sum(q.kind == 'follow-up' for q in questions)} about a follow-up)"
    )
    clients = {CLIENT: {"memory_enabled": True, "mode": "mcp_via_llm"}}
    with running_daemon(clients=clients, **extra) as memd:
        wait_searchable(memd, CLIENT)
        conns = Connections(memd)
        view = IndexView.of(memd, CLIENT)
        sessions = [
            [
                {
                    "conversation_id": f"s{s}-c{c}",
                    "user": ex.user,
                    "assistant": ex.assistant,
                    "timestamp": ex.timestamp,
                }
                for c, conv in enumerate(session)
                for ex in conv
            ]
            for s, session in enumerate(plan)
        ]
        t0 = time.monotonic()
        record_burst(conns, CLIENT, sessions, threads=1)  # one at a time: in order
        chunks, _, _ = wait_indexed(memd, view, CLIENT)
        print(f"recorded and indexed in {time.monotonic() - t0:.1f} s: {chunks} chunks")
        layout = ClientLayout(view.sessions.parent.parent, CLIENT)
        base = Searcher(conns, view, layout)
        scores = [
            base.score(f"{mode} ({what})", questions, mode)
            for mode, what in (
                ("hybrid", "memd's recall"),
                ("bm25", "BM25 alone"),
                ("dense", "dense alone"),
            )
        ]
        base.close()
        table("What memd serves, against its two halves:", scores)
        if not args.no_variants:
            variant_tables(memd, conns, layout, questions)
        print(f"\nevents dropped by memsearch watch: {lost_watch_events(memd, CLIENT)}")
        print(f"at the end: {machine()}")
        conns.close()


def variant_tables(
    memd: Any, conns: Connections, layout: ClientLayout, questions: Sequence[Question]
) -> None:
    """Copy the transcripts, rewritten, into one new client per variant; score each."""
    memory_dir = layout.memory_dir
    for name, (_, rewrite) in VARIANTS.items():
        target = ClientLayout(memory_dir, f"v-{name}")
        target.ensure()
        for path in sorted(layout.sessions.glob("*.md")):
            (target.sessions / path.name).write_text(
                rewrite(path.read_text(encoding="utf-8")), encoding="utf-8"
            )
    clients = {
        CLIENT: {"memory_enabled": True, "mode": "mcp_via_llm"},
        **{f"v-{name}": {"memory_enabled": True, "mode": "mcp_via_llm"} for name in VARIANTS},
    }
    write_config(memd.config_path, base_config(memd.config_path.parent, clients=clients))
    rows: dict[str, list[Score]] = {"hybrid": [], "bm25": []}
    for name, (what, _) in VARIANTS.items():
        client_id = f"v-{name}"
        deadline = time.monotonic() + 120
        while client_id not in memd.call("daemon.status")["clients"]:
            if time.monotonic() > deadline:
                raise TimeoutError("config edit not applied")
            time.sleep(0.2)
        wait_searchable(memd, client_id)
        view = IndexView.of(memd, client_id)
        wait_indexed(memd, view, client_id, progress=False)
        searcher = Searcher(conns, view, ClientLayout(memory_dir, client_id))
        for mode in rows:
            rows[mode].append(searcher.score(f"{name}: {what}", questions, mode))
        searcher.close()
    table("Layouts, hybrid (what memd would serve):", rows["hybrid"])
    table("Layouts, BM25 alone:", rows["bm25"])


if __name__ == "__main__":
    main()
