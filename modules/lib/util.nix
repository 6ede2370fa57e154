# Small builtins-only helpers for modules/lib (no nixpkgs, no lib: these files are evaluated by
# the tests with a bare Nix).
let
  inherit (builtins)
    all
    concatStringsSep
    elem
    elemAt
    filter
    foldl'
    fromJSON
    genList
    length
    match
    ;
in
rec {
  # every user error: `field: reason; fix: ...`, as the CLI words them
  fail =
    field: reason: fix:
    throw "${field}: ${reason}; fix: ${fix}";

  optional = cond: x: if cond then [ x ] else [ ];
  optionals = cond: xs: if cond then xs else [ ];

  unique = foldl' (acc: x: if elem x acc then acc else acc ++ [ x ]) [ ];

  imap0 = f: list: genList (i: f i (elemAt list i)) (length list);

  # "host:port" -> { host; port; } (the plan's dist_init_addr); "http://h:p" -> the same
  hostPort =
    what: text:
    let
      m = match "(https?://)?([^/]+):([0-9]+)/?" text;
    in
    if m == null then
      fail what "${builtins.toJSON text} has no host:port" "regenerate the plan with tp4 plan --json"
    else
      {
        host = elemAt m 1;
        port = fromJSON (elemAt m 2);
      };

  # an IPv4 address as its four octets, or null (no leading zeros: 010 is octal to some tools)
  octets =
    text:
    let
      m = match "([0-9]{1,3})\\.([0-9]{1,3})\\.([0-9]{1,3})\\.([0-9]{1,3})" text;
      parts = map fromJSON m;
    in
    if m == null || !(all (s: match "0|[1-9][0-9]*" s != null) m) then
      null
    else if all (o: o <= 255) parts then
      parts
    else
      null;

  isIPv4 = text: builtins.isString text && octets text != null;

  # the address as one integer (for subnet tests)
  ipv4Int =
    text:
    let
      o = octets text;
    in
    foldl' (acc: x: acc * 256 + x) 0 o;

  pow2 = n: foldl' (acc: _: acc * 2) 1 (genList (x: x) n);

  # whether a and b are in one /prefix network
  sameSubnet =
    prefix: a: b:
    let
      size = pow2 (32 - prefix);
    in
    ipv4Int a / size == ipv4Int b / size;

  # the values that occur more than once, in first-seen order
  duplicates = list: unique (filter (x: length (filter (y: y == x) list) > 1) list);

  joinWords = concatStringsSep " ";
}
