"""Worked answers to lesson 11's exercises, and a wrong answer each check must reject (lessons/README.md)."""


def explained_variance(x, x_hat):
    return 1 - float((x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum())


def uncentred_variance(x, x_hat):
    return 1 - float((x - x_hat).pow(2).sum() / x.pow(2).sum())


def ce_loss_recovered(clean, sae, zero):
    return (zero - sae) / (zero - clean)


def ce_loss_lost(clean, sae, zero):
    return (sae - clean) / (zero - clean)


def patching_effect(patched, clean, corrupt):
    return (patched - corrupt) / (clean - corrupt)


def effect_from_clean(patched, clean, corrupt):
    return (patched - clean) / (clean - corrupt)


def atp(clean_act, corrupt_act, grad):
    return ((clean_act - corrupt_act) * grad).sum(-1)  # (T,)


def atp_wrong_sign(clean_act, corrupt_act, grad):
    return ((corrupt_act - clean_act) * grad).sum(-1)


def induction_head(effects, induction):
    flat = effects.masked_fill(induction <= 0.5, float("-inf")).argmax()
    return divmod(int(flat), effects.shape[1])  # (layer, head)


def largest_effect(effects, induction):
    return divmod(int(effects.argmax()), effects.shape[1])


ANSWERS = {
    "mechanisms.check_explained_variance": (explained_variance, uncentred_variance, "centre"),
    "mechanisms.check_ce_loss_recovered": (ce_loss_recovered, ce_loss_lost, "recovered"),
    "mechanisms.check_patching_effect": (patching_effect, effect_from_clean, "corrupt"),
    "mechanisms.check_atp": (atp, atp_wrong_sign, "sign"),
    "mechanisms.check_induction_head": (induction_head, largest_effect, "detector"),
}
