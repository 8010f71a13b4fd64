#!/usr/bin/env python3
"""Fails if a forbidden crate's item is part of a crate's public API.

Usage: check-public-api.py RUSTDOC_JSON FORBIDDEN_CRATE...

RUSTDOC_JSON is rustdoc's JSON output for the crate (`cargo rustdoc -- -Z
unstable-options --output-format json`). Starting at the crate root, it
walks every item a user of the crate can reach: public modules, `pub use`
re-exports, the public fields of public structs, enum variants and their
fields, function and method signatures (arguments, results, generic
bounds), type aliases, constants, traits and their items, and every impl
of a reachable type, trait impls included (their trait's generic arguments
and associated types too). Any path on that surface that resolves to an
item of a FORBIDDEN_CRATE is printed with where it was found, and the exit
status is 1. So is any `#[deprecated]` item of the crate itself on that
surface: a deprecated name is a shim for a release that had the old one,
and a crate not yet released has none to keep.

Why: fleetcoord's state machines (crate `fleetcoord_sm`) are an
implementation detail. A type of theirs in a public signature would make
every change to the machines' vocabulary a breaking change of fleetcoord,
and would make users depend on a second crate. fleetcoord wraps what it
shows (see src/txn.rs).

What rustdoc itself leaves out is not walked: `#[doc(hidden)]` items and
the auto-trait and blanket impls rustdoc synthesises (they come from core,
not from this crate).

The check refuses to pass vacuously: a JSON layout it does not understand
(a rustdoc format it was not written for) is an error, exit status 2.
"""

import json
import sys

# rustdoc JSON format versions this was written and tested against; others
# are tried, and rejected only if the layout turns out not to match.
KNOWN_FORMATS = range(40, 60)


class LayoutError(Exception):
    """The JSON does not have the layout this checker walks."""


class Checker:
    def __init__(self, doc, forbidden):
        self.index = doc["index"]
        self.paths = doc["paths"]
        self.forbidden_ids = {
            int(crate_id)
            for crate_id, crate in doc["external_crates"].items()
            if crate["name"] in forbidden
        }
        self.seen = set()
        self.leaks = []  # (where, what, forbidden path)
        self.deprecated = []  # (where, the deprecation note)
        self.paths_checked = 0
        self.items_walked = 0

    # ---- what an id names -------------------------------------------------

    def crate_of(self, item_id):
        item = self.index.get(str(item_id))
        if item is not None:
            return item["crate_id"]
        summary = self.paths.get(str(item_id))
        if summary is not None:
            return summary["crate_id"]
        return None

    def full_path(self, item_id):
        summary = self.paths.get(str(item_id))
        if summary is not None:
            return "::".join(summary["path"])
        item = self.index.get(str(item_id))
        if item is not None and item.get("name"):
            return item["name"]
        return f"<item {item_id}>"

    # ---- type references --------------------------------------------------

    def refs(self, value, where, what):
        """Checks every path (a type, a trait) inside `value`.

        A path is an object with a `path` (or, in older formats, `name`)
        string and an `id`; that is how rustdoc writes resolved types,
        trait bounds, the trait of an impl and `dyn` traits. Child items
        are plain integer ids, never objects, so they are not mistaken for
        paths here; `walk` follows them.
        """
        if isinstance(value, dict):
            name = value.get("path", value.get("name"))
            if isinstance(name, str) and isinstance(value.get("id"), int):
                self.paths_checked += 1
                if self.crate_of(value["id"]) in self.forbidden_ids:
                    self.leaks.append((where, what, self.full_path(value["id"])))
            for child in value.values():
                self.refs(child, where, what)
        elif isinstance(value, list):
            for child in value:
                self.refs(child, where, what)

    # ---- items ------------------------------------------------------------

    def walk(self, item_id, where):
        """Walks the item `item_id`, reachable by users as `where`."""
        if item_id is None or item_id in self.seen:
            return
        self.seen.add(item_id)
        item = self.index.get(str(item_id))
        if item is None:
            # An item of another crate that rustdoc did not inline: only its
            # name is known, which `use` already checked.
            return
        self.items_walked += 1
        if item.get("deprecation") is not None and item.get("crate_id") == 0:
            note = (item["deprecation"] or {}).get("note") or ""
            self.deprecated.append((where, note))
        inner = item["inner"]
        if not isinstance(inner, dict) or len(inner) != 1:
            raise LayoutError(f"item {item_id} ({where}): inner is {inner!r:.80}")
        ((kind, body),) = inner.items()
        handler = getattr(self, "walk_" + kind, None)
        if handler is None:
            # Kinds without a type surface of their own (macros, primitives,
            # extern crates, ...): check whatever paths they carry.
            self.refs(body, where, kind)
        else:
            handler(body, where)

    def child(self, child_id, where):
        """Walks a child of a public item if a user can name it."""
        item = self.index.get(str(child_id))
        if item is not None and item["visibility"] != "public":
            return
        name = item.get("name") if item else None
        self.walk(child_id, f"{where}::{name}" if name else where)

    def walk_module(self, body, where):
        for child_id in body["items"]:
            self.child(child_id, where)

    def walk_use(self, body, where):
        target = body["id"]
        shown = f"{where}::{body['name']}" if not body.get("is_glob") else where
        if target is None:
            # A re-export of a primitive or of something rustdoc could not
            # resolve: nothing to check by id.
            return
        crate = self.crate_of(target)
        if crate is None:
            raise LayoutError(f"`pub use {body['source']}` ({where}) names an unknown item")
        if crate in self.forbidden_ids:
            self.leaks.append((shown, f"`pub use {body['source']}`", self.full_path(target)))
            return
        item = self.index.get(str(target))
        if item is not None and body.get("is_glob") and "module" in item["inner"]:
            self.walk_module(item["inner"]["module"], where)
        else:
            self.walk(target, shown)

    def walk_struct(self, body, where):
        self.refs(body.get("generics"), where, "generics")
        kind = body["kind"]
        if isinstance(kind, dict):
            fields = kind.get("plain", {}).get("fields") if "plain" in kind else kind.get("tuple")
            for field_id in fields or []:
                if field_id is not None:
                    self.child(field_id, where)
        for impl_id in body.get("impls", []):
            self.walk(impl_id, where)

    walk_union = walk_struct

    def walk_enum(self, body, where):
        self.refs(body.get("generics"), where, "generics")
        for variant_id in body["variants"]:
            self.child(variant_id, where)
        for impl_id in body.get("impls", []):
            self.walk(impl_id, where)

    def walk_variant(self, body, where):
        kind = body["kind"]
        fields = []
        if isinstance(kind, dict):
            if "tuple" in kind:
                fields = kind["tuple"]
            elif "struct" in kind:
                fields = kind["struct"]["fields"]
        for field_id in fields:
            if field_id is not None:
                # Variant fields have no visibility of their own: they are as
                # public as the enum.
                item = self.index.get(str(field_id))
                name = item.get("name") if item else None
                self.walk(field_id, f"{where}.{name}" if name else where)
        self.refs(body.get("discriminant"), where, "discriminant")

    def walk_struct_field(self, body, where):
        self.refs(body, where, "field type")

    def walk_function(self, body, where):
        self.refs(body.get("sig", body.get("decl")), where, "signature")
        self.refs(body.get("generics"), where, "generic bounds")

    def walk_trait(self, body, where):
        self.refs(body.get("generics"), where, "generics")
        self.refs(body.get("bounds"), where, "supertraits")
        for item_id in body["items"]:
            self.walk(item_id, f"{where}::{self.name_of(item_id)}")
        for impl_id in body.get("implementations", []):
            self.walk(impl_id, where)

    def walk_impl(self, body, where):
        if body.get("is_synthetic") or body.get("blanket_impl") is not None:
            return
        trait = body.get("trait")
        what = f"impl {trait['path'] if trait else ''}".rstrip()
        self.refs(trait, where, what)
        self.refs(body.get("for"), where, what)
        self.refs(body.get("generics"), where, what)
        for item_id in body["items"]:
            item = self.index.get(str(item_id))
            # An inherent impl shows only its public items; a trait impl
            # shows all of them.
            if trait is None and item is not None and item["visibility"] != "public":
                continue
            self.walk(item_id, f"{where}::{self.name_of(item_id)}")

    def walk_type_alias(self, body, where):
        self.refs(body, where, "type alias")

    def walk_constant(self, body, where):
        self.refs(body.get("type"), where, "type")

    def walk_static(self, body, where):
        self.refs(body.get("type"), where, "type")

    def walk_assoc_const(self, body, where):
        self.refs(body, where, "associated constant")

    def walk_assoc_type(self, body, where):
        self.refs(body, where, "associated type")

    def name_of(self, item_id):
        item = self.index.get(str(item_id))
        return (item or {}).get("name") or f"<item {item_id}>"


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    json_path, forbidden = argv[1], set(argv[2:])
    with open(json_path, encoding="utf-8") as f:
        doc = json.load(f)
    version = doc.get("format_version")
    root = doc["index"][str(doc["root"])]
    crate = root["name"]
    checker = Checker(doc, forbidden)
    try:
        if "module" not in root["inner"]:
            raise LayoutError("the crate root is not a module")
        checker.walk(doc["root"], crate)
        if checker.items_walked < 2 or checker.paths_checked == 0:
            raise LayoutError(
                f"walked {checker.items_walked} items and {checker.paths_checked} type paths"
            )
    except (LayoutError, KeyError, TypeError) as e:
        print(
            f"check-public-api: cannot read rustdoc JSON format {version} of `{crate}`"
            f"{'' if version in KNOWN_FORMATS else ' (not a format this script knows)'}: {e!r}",
            file=sys.stderr,
        )
        return 2
    if not checker.forbidden_ids:
        # The crate does not even depend on a forbidden crate: nothing leaks.
        pass
    deprecated = sorted(set(checker.deprecated))
    if deprecated:
        print(
            f"check-public-api: {len(deprecated)} deprecated item(s) in the public API of "
            f"`{crate}`; delete them (nothing released depends on them):",
            file=sys.stderr,
        )
        for where, note in deprecated:
            print(f"  {where}: {note}", file=sys.stderr)
        return 1
    leaks = sorted(set(checker.leaks))
    if leaks:
        names = ", ".join(sorted(forbidden))
        print(
            f"check-public-api: {len(leaks)} item(s) of {names} in the public API of `{crate}`; "
            f"wrap them in a type of `{crate}` (as src/txn.rs does) or make them private:",
            file=sys.stderr,
        )
        for where, what, path in leaks:
            print(f"  {where} ({what}) names {path}", file=sys.stderr)
        return 1
    print(
        f"check-public-api: no item of {', '.join(sorted(forbidden))} in the public API of "
        f"`{crate}` and no deprecated item ({checker.items_walked} items, "
        f"{checker.paths_checked} type paths checked)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
