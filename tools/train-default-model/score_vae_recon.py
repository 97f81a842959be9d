"""Scores VAE reconstructions (torch, the shipped VAE) of the true pictures of the held-out
evaluation prompts with evaluate.py's scorer: how much the VAE alone loses (an upper bound for
what the transformer can reach through it). usage: /usr/bin/python3 score_vae_recon.py [MODEL_DIR | runs/vae.pt]"""
import os, sys, json, torch, numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models as M, export as ex, shapes as S, evaluate as E
torch.set_num_threads(2)
src=sys.argv[1] if len(sys.argv) > 1 else os.path.join(ex.REPO, 'models', 'shapes-flux-tiny')
if src.endswith('.pt'):  # a train_vae.py checkpoint (export.VAE_CFG), rounded to bf16 like the export
    v=M.AutoencoderKL(ex.VAE_CFG); v.load_state_dict(torch.load(src)['model']); ex.round_bf16(v)
else:
    d=src + '/vae'
    v=M.AutoencoderKL(json.load(open(d+'/config.json'))); v.load_state_dict(ex.load_safetensors(d+'/diffusion_pytorch_model.safetensors'))
v.eval()
ps=E.eval_prompts(int(os.environ.get('N', 100)))
imgs=np.stack([S.render(a) for a in ps])
x=torch.from_numpy(imgs).permute(0,3,1,2).float()/127.5-1
with torch.no_grad(): r=v.decode(v.encode(x)[0])
r=((r.clamp(-1,1)+1)*127.5).round().byte().permute(0,2,3,1).numpy()
rows=[{'want':E.expected(a),'got':E.score_image(im,a['shape'])} for a,im in zip(ps,r)]
print('VAE reconstructions of the held-out prompts\' true pictures:', E.summarise(rows))
for name, sub in E.heldout_splits(rows):
    print(f'  held-out {name} pairs (n={len(sub)}):', {k: round(v, 3) for k, v in E.summarise(sub).items()})
