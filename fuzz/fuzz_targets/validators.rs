//! The request validators every front door shares: handler names, short
//! texts, labels, callback URLs under the egress policy, `--egress-allow`
//! entries. Input: a selector byte, then the text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use taskmesh_core::egress::{EgressPolicy, parse_net};
use taskmesh_core::validate;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match which % 6 {
        0 => {
            let _ = validate::handler_name(text);
        }
        1 => {
            let _ = validate::short_text("field", text);
        }
        2 => {
            let (k, v) = text.split_once('=').unwrap_or((text, ""));
            let labels = std::collections::BTreeMap::from([(k.to_string(), v.to_string())]);
            let _ = validate::labels("labels", labels.iter());
        }
        3 => {
            let strict = EgressPolicy::public_only();
            if validate::callback_url(text, &strict).is_ok() && !text.is_empty() {
                // Whatever passed must be an http(s) URL whose literal host,
                // if any, the policy allows.
                assert!(strict.check_url(text).is_ok(), "{text:?}");
            }
        }
        4 => {
            let _ = EgressPolicy::allowing_loopback().check_url(text);
        }
        _ => {
            if let Ok(net) = parse_net(text) {
                let _ = EgressPolicy::allowing(vec![net]).allows(net.addr());
            }
        }
    }
});
